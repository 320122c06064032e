"""ScheduleDef (SPEC 5.2, 9.1): validation and the hook-edit ops. The
scheduler that fires these definitions is not part of this module."""

from __future__ import annotations

import zoneinfo
from typing import Any

from celery.schedules import ParseException, crontab
from croniter import croniter

from apps.substrate.kinds.base import Kind, Refused, drop_unknown
from apps.substrate.kinds.fields import get_flag, get_int, get_text, put
from apps.substrate.kinds.triggers import TRIGGER_OPS, check_credentials, common_trigger_fields
from apps.substrate.models import ScheduleDef, ScheduleDefActive

SCHEDULE_FIELDS = frozenset(
    {
        "agent",
        "prompt",
        "schedule",
        "user_tier_schedules",
        "timezone",
        "enabled",
        "catch_up_max",
        "max_fires",
        "user_id",
        "user_tier",
        "user_credentials",
        "user_credentials_from_env",
        "required_credentials",
        "on_complete",
        "metadata",
        "tenant_id",
    }
)
_CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


def parse_cron(expr: Any, what: str) -> crontab:
    """A standard 5-field cron (robfig/cron's `ParseStandard`: `?` for `*` in
    the day fields, @hourly-style descriptors) as a celery crontab."""
    if not isinstance(expr, str) or not expr.strip():
        raise Refused(f"{what} must be a 5-field cron expression")
    fields = cron_fields(expr)
    if len(fields) != 5:
        raise Refused(f"{what} {expr!r}: want 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}")
    for field, value in zip(_CRON_FIELDS, fields, strict=True):
        try:
            crontab(**{field: value})
        except (ValueError, ParseException) as exc:
            detail = "" if "literal" in str(exc) else f" ({exc})"
            label = field.replace("_", " ").replace("month of year", "month")
            raise Refused(f"{what} {expr!r}: invalid {label} field {value!r}{detail}") from exc
    try:
        parsed = crontab(**dict(zip(_CRON_FIELDS, fields, strict=True)))
    except (ValueError, ParseException) as exc:
        raise Refused(f"{what} {expr!r}: {exc}") from exc
    if not croniter.is_valid(" ".join(fields)):  # what the scheduler computes fire times with
        raise Refused(f"{what} {expr!r}: not a cron expression the scheduler can evaluate")
    return parsed


def cron_fields(expr: str) -> list[str]:
    """`expr` as its 5 standard fields: descriptors expanded, `?` read as `*` in
    the day fields (robfig/cron's ParseStandard). The scheduler evaluates the
    joined fields with croniter (apps.triggers.cron)."""
    fields = _CRON_ALIASES.get(expr.strip().lower(), expr).split()
    return ["*" if f == "?" and i in (2, 4) else f for i, f in enumerate(fields)]


def _check_timezone(value: Any, what: str) -> str:
    if value is None or value == "":
        return "UTC"
    if not isinstance(value, str):
        raise Refused(f"{what}: timezone must be an IANA name such as 'Europe/Paris'")
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise Refused(f"{what}: timezone {value!r} is not a known IANA time zone") from exc
    return value


CATCH_UP_MAX_LIMIT = 100  # missed slots fired after an outage, at most
PROMPT_ROLES = ("user", "system")
PROMPT_BLOCK_TYPES = ("trusted-text", "untrusted-block", "text")  # "text" is trusted text
_PROMPT_SHAPE = (
    "text, or a list of {role: user|system, content: [{type: trusted-text|untrusted-block|text, text, kind?}]}"
)


def _check_block(block: Any, where: str) -> None:
    if not isinstance(block, dict) or block.get("type") not in PROMPT_BLOCK_TYPES:
        got = block.get("type") if isinstance(block, dict) else block
        raise Refused(
            f"{where}: each content block must be {{type: {'|'.join(PROMPT_BLOCK_TYPES)}, text}} (got {got!r})"
        )
    if not isinstance(block.get("text"), str):
        raise Refused(f"{where}: content block text must be a string")
    allowed = {"type", "text", "kind"} if block["type"] == "untrusted-block" else {"type", "text"}
    if set(block) - allowed:
        raise Refused(f"{where}: content block of type {block['type']} takes only {', '.join(sorted(allowed))}")
    if "kind" in block and not isinstance(block["kind"], str):
        raise Refused(f"{where}: an untrusted-block's kind must be a string")


def _check_prompt(value: Any, what: str) -> Any:
    """loomcycle's prompt forms (SPEC 5.2): plain text, or messages of content blocks
    (apps.triggers maps them onto apps.runs.prompt segments when the schedule fires)."""
    if value is None:
        return value
    if isinstance(value, str):
        if not value.strip():
            raise Refused(f"{what}: prompt is blank (omit it for the default line, or give text)")
        return value
    if not isinstance(value, list) or not value:
        raise Refused(f"{what}: prompt must be {_PROMPT_SHAPE}")
    for i, message in enumerate(value):
        where = f"{what}: prompt[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise Refused(f"{where} must be an object with role and content")
        if message.get("role") not in PROMPT_ROLES:
            raise Refused(f"{where}: role must be user or system (got {message.get('role')!r})")
        content = message.get("content")
        if not isinstance(content, list) or not content:
            raise Refused(f"{where}: content must be a non-empty list of content blocks")
        for block in content:
            _check_block(block, where)
    if not any(message["role"] == "user" for message in value):
        raise Refused(f"{what}: prompt needs a user message (a run starts from one)")
    if not any(m["role"] == "user" and any(b["text"].strip() for b in m["content"]) for m in value):
        raise Refused(f"{what}: prompt's user messages are blank (a run starts from user text)")
    return value


def normalise_schedule(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"schedule {name!r}"
    raw = dict(raw)
    raw.pop("name", None)
    d = drop_unknown(name, "schedule", raw, SCHEDULE_FIELDS, strict)
    out: dict[str, Any] = {"agent": get_text(d, "agent", what, required=True)}
    cron, tiers = d.get("schedule"), d.get("user_tier_schedules")
    if cron and tiers:
        raise Refused(f"{what}: schedule and user_tier_schedules are mutually exclusive; set one")
    if cron:
        parse_cron(cron, f"{what}: schedule")
        out["schedule"] = cron.strip()
    elif tiers:
        if not isinstance(tiers, dict):
            raise Refused(f"{what}: user_tier_schedules must map a user tier to a cron expression")
        for tier, expr in tiers.items():
            parse_cron(expr, f"{what}: user_tier_schedules.{tier}")
        pick = get_text(d, "user_tier", what) or "default"
        if pick not in tiers:
            raise Refused(f"{what}: user_tier_schedules has no entry for user tier {pick!r} (has {sorted(tiers)})")
        out["user_tier_schedules"] = {str(k): v.strip() for k, v in tiers.items()}
    else:
        raise Refused(f"{what}: missing required field: schedule (a 5-field cron) or user_tier_schedules")
    out["timezone"] = _check_timezone(d.get("timezone"), what)
    out["enabled"] = get_flag(d, "enabled", what, True)
    catch_up = get_int(d, "catch_up_max", what, minimum=0)
    if catch_up is not None and catch_up > CATCH_UP_MAX_LIMIT:
        raise Refused(f"{what}: catch_up_max must be at most {CATCH_UP_MAX_LIMIT} (got {catch_up})")
    put(out, "catch_up_max", catch_up)
    put(out, "max_fires", get_int(d, "max_fires", what, minimum=0))
    put(out, "prompt", _check_prompt(d.get("prompt"), what))
    put(out, "user_id", get_text(d, "user_id", what))
    out |= check_credentials(d, what)
    out |= common_trigger_fields(d, what, strict)
    return out


SCHEDULE = Kind(
    key="schedule",
    tool="ScheduleDef",
    model=ScheduleDef,
    pointer=ScheduleDefActive,
    ops=TRIGGER_OPS,
    normalise=normalise_schedule,
    content_hash=None,
    fork_promotes=True,
    yaml_key="scheduled_runs",
    credential_env_fields=("user_credentials_from_env",),
)
