"""What ScheduleDef and WebhookDef share: `on_complete` hooks (SPEC 9.1),
credentials by environment name, tenant, user tier and metadata."""

from __future__ import annotations

from typing import Any

from apps.substrate.kinds.base import Refused, drop_unknown, string_list
from apps.substrate.kinds.fields import IDENT_RE, check_channel_name, get_object, get_str_map, get_text, put

_HOOKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # kind -> (required text fields, optional fields)
    "channel.publish": (("channel",), ("payload",)),
    "memory.set": (("scope", "key"), ("payload",)),
    "mcp.call": (("server", "tool"), ("args",)),
}


TRIGGER_OPS = frozenset({"create", "fork", "get", "list", "retire"})  # ScheduleDef and WebhookDef


def check_hook(hook: Any, what: str, strict: bool) -> dict[str, Any]:
    """One `on_complete` hook (SPEC 9.1): channel.publish, memory.set or mcp.call."""
    if not isinstance(hook, dict) or hook.get("kind") not in _HOOKS:
        got = hook.get("kind") if isinstance(hook, dict) else hook
        raise Refused(f"{what}: hook kind must be one of {', '.join(_HOOKS)} (got {got!r})")
    kind = hook["kind"]
    required, optional = _HOOKS[kind]
    out = drop_unknown(kind, f"{what}: hook", hook, frozenset({"kind", *required, *optional}), strict)
    for field in required:
        get_text(out, field, f"{what} ({kind})", required=True)
    if kind == "channel.publish":
        check_channel_name(out["channel"], f"{what} ({kind})")
    if kind == "memory.set" and out["scope"] not in ("agent", "user", "global"):
        raise Refused(f"{what} (memory.set): scope must be agent, user or global (got {out['scope']!r})")
    if kind == "mcp.call":
        get_object(out, "args", f"{what} (mcp.call)")
    return out


def check_hooks(value: Any, what: str, strict: bool) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refused(f"{what}: on_complete must be a list of hooks")
    return [check_hook(h, f"{what}: on_complete[{i}]", strict) for i, h in enumerate(value)]


def check_credentials(d: dict[str, Any], what: str) -> dict[str, Any]:
    if d.get("user_credentials"):
        raise Refused(
            f"{what}: user_credentials would store secret values in the definition; "
            "use user_credentials_from_env {name: ENV_VAR} instead"
        )
    out: dict[str, Any] = {}
    from_env = get_str_map(d, "user_credentials_from_env", what, env_values=True) or {}
    put(out, "user_credentials_from_env", from_env or None)
    required = string_list(d.get("required_credentials"), f"{what}: required_credentials")
    for cred in required:
        if cred not in from_env:
            raise Refused(f"{what}: required credential {cred!r} is missing from user_credentials_from_env")
    put(out, "required_credentials", required or None)
    return out


def check_tenant(d: dict[str, Any], what: str) -> str:
    tenant = get_text(d, "tenant_id", what)
    if tenant and not IDENT_RE.fullmatch(tenant):
        raise Refused(f"{what}: tenant_id {tenant!r} must match [A-Za-z0-9_-]{{1,128}}")
    return tenant


def common_trigger_fields(d: dict[str, Any], what: str, strict: bool) -> dict[str, Any]:
    """Fields ScheduleDef and WebhookDef share: who the run is for, hooks, metadata."""
    out: dict[str, Any] = {}
    put(out, "user_tier", get_text(d, "user_tier", what))
    put(out, "metadata", get_object(d, "metadata", what) or None)
    put(out, "tenant_id", check_tenant(d, what))
    put(out, "on_complete", check_hooks(d.get("on_complete"), what, strict) or None)
    return out
