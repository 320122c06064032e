"""MCPServerDef (SPEC 5.2): http/streamable-http servers at runtime, stdio only from yaml.
There is no MCP client in this build, so `rediscover` refuses."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from apps.substrate.kinds import Kind, Refused, _drop_unknown, string_list
from apps.substrate.kinds_admin.fields import get_str_map, get_text, put

MCP_FIELDS = frozenset({"transport", "url", "headers", "description", "command", "args", "env", "tools"})
HTTP_TRANSPORTS = ("http", "streamable-http")


def host_allowed(host: str, allowlist: tuple[str, ...] | list[str]) -> bool:
    """SPEC 8: suffix match at a dot boundary, trailing dots ignored, `*` = any."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry = entry.strip().lower().rstrip(".").lstrip(".")
        if entry == "*" or host == entry or (entry and host.endswith("." + entry)):
            return True
    return False


def _check_url(url: str, what: str, strict: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused(f"{what}: url {url!r} must use http or https")
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        raise Refused(f"{what}: url {url!r}: {exc}") from exc
    if not host:
        raise Refused(f"{what}: url {url!r} has no host")
    allowlist = settings.LOOMCYCLE.http_host_allowlist
    # The SSRF gate is for runtime registration; operator yaml is trusted (SPEC 8).
    if strict and allowlist and not host_allowed(host, allowlist):
        raise Refused(f"{what}: url host {host!r} is not in LOOMCYCLE_HTTP_HOST_ALLOWLIST")
    return url


def normalise_mcpserver(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"mcp server {name!r}"
    raw = dict(raw)
    raw.pop("name", None)
    d = _drop_unknown(name, "mcp server", raw, MCP_FIELDS, strict)
    transport = d.get("transport")
    out: dict[str, Any] = {"transport": transport}
    if transport == "stdio":
        if strict:
            raise Refused(
                f"{what}: transport 'stdio' is accepted only from loomcycle.yaml; use http or streamable-http"
            )
        if d.get("url") or d.get("headers"):
            raise Refused(f"{what}: url and headers are for http transports, not stdio")
        out["command"] = get_text(d, "command", what, required=True)
        put(out, "args", string_list(d.get("args"), f"{what}: args") or None)
        put(out, "env", get_str_map(d, "env", what) or None)
    elif transport in HTTP_TRANSPORTS:
        if d.get("command") or d.get("args") or d.get("env"):
            raise Refused(f"{what}: command, args and env are for stdio servers, not {transport}")
        out["url"] = _check_url(get_text(d, "url", what, required=True), what, strict)
        put(out, "headers", get_str_map(d, "headers", what) or None)
    else:
        allowed = "http, streamable-http" + ("" if strict else ", stdio")
        raise Refused(f"{what}: transport must be one of {allowed} (got {transport!r})")
    put(out, "description", get_text(d, "description", what))
    put(out, "tools", string_list(d.get("tools"), f"{what}: tools") or None)
    return out


def mcpserver_rediscover(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    raise Refused("rediscover: MCP discovery is not available in this build")
