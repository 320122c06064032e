"""The definition kinds: for each, its models, tool name, ops, how a
definition is validated and normalised, and how its content hash is taken.

`normalise(name, definition, strict)` returns the stored definition or raises
`Refused` with a message the caller (model or operator) can act on. `strict`
is False for yaml, where unknown fields are dropped with a warning (as
loomcycle's config loader does), and True for runtime writes, where they are
refused so a typo never silently vanishes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apps.core.quotas import TenantQuotaExceeded
from apps.gateway.resolver import validate_agent_routing
from apps.substrate import hashing
from apps.substrate.models import (
    AgentDef,
    AgentDefActive,
    SkillDef,
    SkillDefActive,
)

log = logging.getLogger("loomcycle.substrate")

NAME_SEGMENT_RE = re.compile(r"[A-Za-z0-9_-]+")


class Refused(Exception):
    """A def op refused: 422 `tool_refused` (or the refusal's own `code`) over HTTP,
    an `is_error` result for a model."""

    status: int = 422
    code: str = "tool_refused"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class RefusedNotFound(Refused):
    """The row does not exist for this caller (another tenant's row looks the
    same): 404 over HTTP, an `is_error` result for a model."""

    status, code = 404, "not_found"


# What a def op refuses with: a Refused, or past a per-tenant count of names the one
# quota error every counted resource raises (apps.core.quotas, via apps.substrate.quotas).
# Every transport answers both alike: REST and MCP with the error's status, code and
# details plus the tool's name, an agent's def tool with an `is_error` result.
Refusal = Refused | TenantQuotaExceeded
REFUSALS = (Refused, TenantQuotaExceeded)


def refusal_details(exc: Refusal) -> dict[str, Any]:
    return dict(exc.details) if isinstance(exc, TenantQuotaExceeded) else {}


def check_def_name(name: Any) -> str:
    """SPEC 5.2: <=128 chars, `/`-separated segments of [A-Za-z0-9_-]."""
    if not isinstance(name, str) or not name:
        raise Refused("missing required field: name")
    if len(name) > 128:
        raise Refused(f"name {name[:40]!r}... is longer than 128 characters")
    for segment in name.split("/"):
        if not NAME_SEGMENT_RE.fullmatch(segment):
            raise Refused(f"name {name!r}: each '/'-separated segment must match [A-Za-z0-9_-]+")
    return name


def string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{what} must be a list of strings")
    return list(value)


def _drop_unknown(name: str, kind: str, raw: dict[str, Any], known: frozenset[str], strict: bool) -> dict[str, Any]:
    unknown = sorted(set(raw) - known)
    if unknown:
        if strict:
            raise Refused(f"{kind} {name!r}: unknown field(s) {', '.join(unknown)}")
        log.warning("%s %s: ignoring fields this build does not know: %s", kind, name, unknown)
    return {k: v for k, v in raw.items() if k in known}


# --- AgentDef -----------------------------------------------------------------

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
    }
) - {"name", "code_body"}
_INT_FIELDS = ("max_tokens", "max_iterations", "max_concurrent_children", "memory_quota_bytes", "retry_attempts")


def normalise_agent(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    raw = dict(raw)
    raw.pop("name", None)
    if "allowed_tools" in raw:  # loomcycle's older spelling of `tools`
        raw.setdefault("tools", raw.pop("allowed_tools"))
    definition = _drop_unknown(name, "agent", raw, AGENT_FIELDS, strict)
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
    if definition.get("max_iterations") == 0:
        raise Refused(f"agent {name!r}: max_iterations must be a positive integer")
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


# --- SkillDef -----------------------------------------------------------------

SKILL_FIELDS = frozenset({"body", "description", "tools"})


def normalise_skill(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    raw = dict(raw)
    raw.pop("name", None)
    definition = _drop_unknown(name, "skill", raw, SKILL_FIELDS, strict)
    body = definition.get("body")
    if not isinstance(body, str) or not body.strip():
        raise Refused(f"skill {name!r}: body is required and must be non-empty text")
    definition["body"] = hashing.normalise_text(body)
    if not isinstance(definition.get("description", ""), str):
        raise Refused(f"skill {name!r}: description must be text")
    definition["tools"] = string_list(definition.get("tools"), f"skill {name!r}: tools")
    return definition


# --- registry -----------------------------------------------------------------

Normaliser = Callable[[str, dict[str, Any], bool], dict[str, Any]]
Hasher = Callable[[str, dict[str, Any]], str]

VERSIONED_OPS = frozenset({"create", "fork", "get", "list", "retire", "promote", "verify"})


@dataclass(frozen=True)
class Kind:
    key: str  # URL/CLI key: /v1/_<key>def
    tool: str  # tool name, also the admin-facing label
    # Concrete subclasses of VersionedDef / DefPointer. Typed Any because the
    # django-stubs plugin cannot see fields declared on abstract bases.
    model: Any
    pointer: Any
    ops: frozenset[str]
    normalise: Normaliser
    content_hash: Hasher | None  # None: kind has no content hash (no verify)
    fork_promotes: bool = False  # fork's default for `promote`
    agent_callable: bool = False  # usable by agents as a tool (SPEC 6.5)
    yaml_key: str = ""  # top-level loomcycle.yaml block
    tools_field: str | None = None  # field holding a tool list that may narrow, never widen
    secret_fields: tuple[str, ...] = ()  # string maps holding `${NAME}` references or secret values
    # Environment names a trigger reads when it fires: a {credential: ENV_VAR} map, or `a.b`, one name.
    credential_env_fields: tuple[str, ...] = ()


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
    KINDS[kind.key] = kind


def get_kind(key: str) -> Kind:
    return KINDS[key]


register(
    Kind(
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
)
register(
    Kind(
        key="skill",
        tool="SkillDef",
        model=SkillDef,
        pointer=SkillDefActive,
        ops=VERSIONED_OPS,
        normalise=normalise_skill,
        content_hash=hashing.skill_content_sha256,
        agent_callable=True,
        yaml_key="skills",
        tools_field="tools",
    )
)


from apps.substrate import kinds_admin  # noqa: E402,F401  (registers the admin-plane kinds)
