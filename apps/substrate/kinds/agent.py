"""The AgentDef kind: an agent's fields, how they are validated and normalised."""

from __future__ import annotations

from typing import Any

from apps.gateway.resolver import validate_agent_routing
from apps.substrate import hashing
from apps.substrate.kinds.base import VERSIONED_OPS, Kind, Refused, drop_unknown, string_list
from apps.substrate.models import AgentDef, AgentDefActive

AGENT_FIELDS = frozenset(
    hashing.AGENT_HASH_FIELDS
    | {
        "skills",
        "interactive",
        "disable_context",
        "agent_def_scopes",
        "skill_def_scopes",
        "schedule_def_scopes",
        "volume_def_scopes",
        "a2a_server_card_def_scopes",
        "a2a_agent_def_scopes",
        "volumes",
        "run_timeout_seconds",
        "retry_attempts",
        "memory_consolidation",
        "retention",  # "" | "default" | "no_trace" (docs/operations.md, "Data lifecycle")
        "webhook",  # a default completion webhook of its runs (checked in full at run creation)
    }
) - {"name", "code_body"}
_INT_FIELDS = ("max_tokens", "max_iterations", "max_concurrent_children", "memory_quota_bytes", "retry_attempts")


def normalise_agent(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    raw = dict(raw)
    raw.pop("name", None)
    if "allowed_tools" in raw:  # loomcycle's older spelling of `tools`
        raw.setdefault("tools", raw.pop("allowed_tools"))
    definition = drop_unknown(name, "agent", raw, AGENT_FIELDS, strict)
    tools = definition.get("tools", [])
    if isinstance(tools, str):  # Claude-Code comma-string form
        tools = [t.strip() for t in tools.split(",") if t.strip()]
    definition["tools"] = string_list(tools, f"agent {name!r}: tools")
    if "skills" in definition:
        definition["skills"] = string_list(definition["skills"], f"agent {name!r}: skills")
    for key in ("memory_scopes", "agent_def_scopes", "skill_def_scopes", "evaluation_scopes"):
        if key in definition:
            definition[key] = string_list(definition[key], f"agent {name!r}: {key}")
    if isinstance(definition.get("system_prompt"), str):  # stored as hashed: CRLF -> LF, no trailing space
        definition["system_prompt"] = hashing.normalise_text(definition["system_prompt"])
    routing_error = validate_agent_routing(name, definition)
    if routing_error:
        raise Refused(routing_error)
    for key, limit in (("provider", 64), ("model", 256)):  # the run row's column sizes
        if len(str(definition.get(key) or "")) > limit:
            raise Refused(f"agent {name!r}: {key} is longer than {limit} characters")
    for key in _INT_FIELDS:
        value = definition.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise Refused(f"agent {name!r}: {key} must be a non-negative integer")
    if definition.get("retention", "") not in ("", "default", "no_trace"):
        raise Refused(f"agent {name!r}: retention must be one of default, no_trace")
    if definition.get("max_iterations") == 0:
        raise Refused(f"agent {name!r}: max_iterations must be a positive integer")
    hook = definition.get("webhook")
    if hook is not None and not (isinstance(hook, dict) and isinstance(hook.get("url"), str)):
        raise Refused(f"agent {name!r}: webhook must be an object with a url")
    compaction_error = _compaction_error(definition.get("compaction"))
    if compaction_error:
        raise Refused(f"agent {name!r}: compaction: {compaction_error}")
    return definition


_COMPACTION_BOOLS = ("enabled", "keep_first", "memory_flush")
_COMPACTION_PERCENTS = ("target_percentage", "autocompact_at_pct")


def _compaction_error(block: Any) -> str | None:
    """What is wrong with an agent's `compaction` block (docs/compaction.md), None when nothing.
    Unset (null) fields are allowed everywhere; 0 means "off" for the percentages."""
    if block is None:
        return None
    if not isinstance(block, dict):
        return "must be a mapping"
    unknown = sorted(set(block) - {*_COMPACTION_BOOLS, *_COMPACTION_PERCENTS, "keep_last_n", "model"})
    if unknown:
        return f"unknown field {unknown[0]!r}"
    for key in _COMPACTION_BOOLS:
        if block.get(key) is not None and not isinstance(block[key], bool):
            return f"{key} must be true or false"
    for key in _COMPACTION_PERCENTS:
        if not _int_in(block.get(key), 0, 100):
            return f"{key} must be an integer from 0 (off) to 100"
    if not _int_in(block.get("keep_last_n"), 0, 1000):
        return "keep_last_n must be an integer from 0 (the default, 2) to 1000"
    if block.get("model") is not None and (not isinstance(block["model"], str) or len(block["model"]) > 256):
        return "model must be a model name of at most 256 characters"
    return None


def _int_in(value: Any, low: int, high: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high)


AGENT = Kind(
    key="agent",
    tool="AgentDef",
    model=AgentDef,
    pointer=AgentDefActive,
    ops=VERSIONED_OPS,
    normalise=normalise_agent,
    content_hash=hashing.agent_content_sha256,
    agent_callable=True,
    yaml_key="agents",
    tools_field="tools",
)
