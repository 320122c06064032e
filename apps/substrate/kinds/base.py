"""What a definition kind is (`Kind`), what a def op refuses with (`Refused`), and the field
checks every kind's normaliser shares. Each kind is a module of this package that builds its
`Kind` from these; the package's __init__ lists them.

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


def drop_unknown(name: str, kind: str, raw: dict[str, Any], known: frozenset[str], strict: bool) -> dict[str, Any]:
    unknown = sorted(set(raw) - known)
    if unknown:
        if strict:
            raise Refused(f"{kind} {name!r}: unknown field(s) {', '.join(unknown)}")
        log.warning("%s %s: ignoring fields this build does not know: %s", kind, name, unknown)
    return {k: v for k, v in raw.items() if k in known}


# --- what a kind is -------------------------------------------------------------

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
