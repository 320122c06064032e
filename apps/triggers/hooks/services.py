"""Writes of hook registrations (SPEC 2.9).

Invariants:
- A registration belongs to the registering principal's tenant; (tenant,
  owner, name) is its identity. Registering it again replaces the row in one
  INSERT ... ON CONFLICT UPDATE (no read-then-write race between two
  registrars): it keeps its place in the chain (`seq`) and gets a new id.
- Everything is validated before the write; a bad field is a 400
  `invalid_registration` naming the field.
- Every write tells every process (apps.triggers.hooks.cache.bump) after it
  commits, so the next tool call anywhere sees it.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction

from apps.core import egress, hosts
from apps.core.errors import Invalid, NotFound
from apps.core.types import Principal
from apps.triggers.hooks import cache
from apps.triggers.models import HookFailMode, HookPhase, HookRegistration

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # owner and name (":" separates tenant:owner in the permit list)
PATTERN_RE = re.compile(r"[A-Za-z0-9_./:-]{1,128}\*?|\*")
MAX_PATTERNS = 64
MAX_URL_CHARS = 2048
DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS = 5000, 60_000
FIELDS = frozenset({"owner", "name", "phase", "agents", "tools", "callback_url", "fail_mode", "timeout_ms"})


def _invalid(message: str) -> Invalid:
    return Invalid(message, code="invalid_registration")


@dataclass(frozen=True)
class HookSpec:
    """A validated registration body."""

    owner: str
    name: str
    phase: HookPhase
    agents: list[str]
    tools: list[str]
    callback_url: str
    fail_mode: HookFailMode
    timeout_ms: int


def hook_spec(data: dict[str, Any]) -> HookSpec:
    """The body checked field by field; 400 `invalid_registration` on the first bad one."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise _invalid(f"unknown fields {unknown}; a hook takes {sorted(FIELDS)}")
    return HookSpec(
        owner=_ident(data, "owner"),
        name=_ident(data, "name"),
        phase=_choice(data, "phase", HookPhase, None),
        agents=_patterns(data, "agents", globs=False),
        tools=_patterns(data, "tools", globs=True),
        callback_url=callback_url_check(data.get("callback_url")),
        fail_mode=_choice(data, "fail_mode", HookFailMode, HookFailMode.OPEN),
        timeout_ms=_timeout(data.get("timeout_ms")),
    )


def _ident(data: dict[str, Any], field: str) -> str:
    value = data.get(field)
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise _invalid(f"{field} is required: 1-128 characters of [A-Za-z0-9_.-]")
    return value


C = TypeVar("C", HookPhase, HookFailMode)


def _choice(data: dict[str, Any], field: str, kind: type[C], default: C | None) -> C:
    value = data.get(field)
    if value is None and default is not None:
        return default
    if value not in kind.values:
        raise _invalid(f"{field} must be one of {list(kind.values)}")
    return kind(value)


def _patterns(data: dict[str, Any], field: str, *, globs: bool) -> list[str]:
    value = data.get(field)
    if value is None:
        return ["*"]
    if not isinstance(value, list) or not value or len(value) > MAX_PATTERNS:
        raise _invalid(f'{field} must be a non-empty list of at most {MAX_PATTERNS} names (default ["*"])')
    for item in value:
        ok = isinstance(item, str) and PATTERN_RE.fullmatch(item) is not None
        if not ok or (not globs and item != "*" and item.endswith("*")):
            kinds = 'exact names, "*" or a trailing-* prefix' if globs else 'exact names or "*"'
            raise _invalid(f"{field}: {item!r} is not allowed; use {kinds}")
    return list(value)


def _timeout(value: Any) -> int:
    if value is None:
        return DEFAULT_TIMEOUT_MS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TIMEOUT_MS:
        raise _invalid(f"timeout_ms must be an integer from 1 to {MAX_TIMEOUT_MS} (default {DEFAULT_TIMEOUT_MS})")
    return value


def callback_url_check(value: Any) -> str:
    """http(s), a host, no credentials, within the operator's host allowlist when
    set, not a blocked address literal (the egress guard checks the host and every
    resolved address again at each call: the allowlist may change after this)."""
    if not isinstance(value, str) or not value or len(value) > MAX_URL_CHARS:
        raise _invalid(f"callback_url is required (an http or https URL of at most {MAX_URL_CHARS} characters)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise _invalid(f"callback_url is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid("callback_url must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise _invalid("callback_url must not carry credentials (user:password@)")
    blocked = _blocked_literal(parts.hostname)
    if blocked:
        raise _invalid(
            f"callback_url host {parts.hostname!r} is a blocked address ({blocked}); "
            "a private host must be in LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST"
        )
    allowlist = settings.LOOMCYCLE.http_host_allowlist
    if allowlist and not hosts.host_matches(parts.hostname, allowlist):
        raise _invalid(f"callback_url host {parts.hostname!r} is not in LOOMCYCLE_HTTP_HOST_ALLOWLIST")
    return value


def _blocked_literal(host: str) -> str | None:
    """Why a literal host may never be called (egress's address ranges), or None."""
    host = hosts.normalise_host(host)
    if hosts.host_matches(host, settings.LOOMCYCLE.http_private_host_allowlist):
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return "loopback"
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None  # a name: resolved and checked by the egress guard at each call
    return egress.address_refusal(addr)


def _new_hook_id() -> str:
    return f"hook_{secrets.token_hex(8)}"


def hook_register(*, principal: Principal, spec: HookSpec) -> HookRegistration:
    """Insert, or replace in place the caller's tenant's (owner, name) with a new id."""
    values = {
        "phase": spec.phase,
        "agents": spec.agents,
        "tools": spec.tools,
        "callback_url": spec.callback_url,
        "fail_mode": spec.fail_mode,
        "timeout_ms": spec.timeout_ms,
    }
    row = HookRegistration(
        hook_id=_new_hook_id(), tenant_id=principal.tenant_id, owner=spec.owner, name=spec.name, **values
    )
    with transaction.atomic():
        _lock_tenant(principal.tenant_id)
        _check_cap(principal.tenant_id, spec)
        # one statement: two registrars of the same (owner, name) cannot both insert
        HookRegistration.objects.bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["tenant_id", "owner", "name"],
            update_fields=["hook_id", *values, "updated_at"],
        )
        transaction.on_commit(cache.bump)
    # No re-read by hook_id: a concurrent registrar of the same (owner, name) may already
    # have replaced it. The row (pk) is stable; only created_at is the database's.
    created = HookRegistration.objects.filter(pk=row.pk).values_list("created_at", flat=True).first()
    if created is not None:
        row.created_at = created
    return row


def _lock_tenant(tenant_id: str) -> None:
    """Serialise registrations of one tenant (a transaction-scoped advisory lock), so the cap is exact."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"lc:hooks:{tenant_id}"])


def _check_cap(tenant_id: str, spec: HookSpec) -> None:
    """At most LOOMCYCLE_HOOKS_MAX_PER_TENANT registrations per tenant; replacing one is always allowed."""
    cap = settings.LOOMCYCLE.hooks_max_per_tenant
    rows = HookRegistration.objects.filter(tenant_id=tenant_id)
    if rows.filter(owner=spec.owner, name=spec.name).exists() or rows.count() < cap:
        return
    raise _invalid(
        f"this tenant already has {cap} hook registrations (LOOMCYCLE_HOOKS_MAX_PER_TENANT); delete one first"
    )


def hook_delete(*, principal: Principal, hook_id: str) -> str:
    """Delete one of the caller's tenant's hooks (any tenant's for an admin); 404 otherwise."""
    rows = HookRegistration.objects.filter(hook_id=hook_id)
    if principal.read_tenant is not None:
        rows = rows.filter(tenant_id=principal.read_tenant)
    with transaction.atomic():
        deleted, _ = rows.delete()
        if not deleted:
            raise NotFound(f"no hook {hook_id!r}", code="not_found")
        transaction.on_commit(cache.bump)
    return hook_id
