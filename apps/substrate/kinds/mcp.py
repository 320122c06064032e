"""MCPServerDef (SPEC 5.2): http/streamable-http servers at runtime, stdio only from yaml.
The MCP client (apps.mcp) adds `rediscover` and discovery on create/fork.

`headers` and `env` are secret-bearing: they are stored with their `${NAME}`
references as written (yaml expansion skips them), so rows, hashes and every
answer carry the reference. `mcp_server_connection` is the one place that
resolves them, for the MCP client at connect time (apps.substrate.kinds.secretrefs
has the rules every secret-bearing field follows).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from apps.core import egress
from apps.core.config import runtime_config
from apps.core.hosts import host_matches
from apps.core.secrets import config_secret_names, resolve_references
from apps.substrate import hashing
from apps.substrate.kinds.base import Kind, Refused, drop_unknown, string_list
from apps.substrate.kinds.fields import get_secret_map, get_text, put
from apps.substrate.kinds.secretrefs import check_tenant_refs
from apps.substrate.models import DefSource, MCPServerDef, MCPServerDefActive, VersionedDef

MCP_FIELDS = frozenset({"transport", "url", "headers", "description", "command", "args", "env", "tools"})
HTTP_TRANSPORTS = ("http", "streamable-http")


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
    if strict and allowlist and not host_matches(host, allowlist):
        raise Refused(f"{what}: url host {host!r} is not in LOOMCYCLE_HTTP_HOST_ALLOWLIST")
    if strict:
        _check_literal_address(host, what)
    return url


check_peer_url = _check_url  # the same registration gate for other remote peers (kinds.a2a)


def _check_literal_address(host: str, what: str) -> None:
    """An IP-literal host is refused at registration when the egress guard would refuse
    dialling it (a non-public address whose host is not privately allowlisted), even
    with `discover: false`. A name is checked when it is resolved, at every connect."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return  # a name, not an address
    try:
        egress.check_addresses(host, [host], egress.operator_policy(None))
    except egress.EgressRefused as exc:
        raise Refused(f"{what}: {exc.reason}") from exc


def _check_server_name(name: str, what: str) -> None:
    """A server's tools are named `mcp__<name>__<tool>` (other characters as `_`), and agents
    grant them by globs such as `mcp__<name>__*`: a name whose mapped form holds `__` or
    starts or ends with `_` could fall inside another server's glob, so it is refused."""
    mapped = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if "__" in mapped or mapped.startswith("_") or mapped.endswith("_"):
        raise Refused(
            f"{what}: a server name may not contain '__' (a '/' counts as '_') nor start or end with '_': "
            "its tools are named mcp__<server>__<tool>"
        )


def normalise_mcpserver(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"mcp server {name!r}"
    _check_server_name(name, what)
    raw = dict(raw)
    raw.pop("name", None)
    d = drop_unknown(name, "mcp server", raw, MCP_FIELDS, strict)
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
        put(out, "env", get_secret_map(d, "env", what, runtime=strict) or None)
    elif transport in HTTP_TRANSPORTS:
        if d.get("command") or d.get("args") or d.get("env"):
            raise Refused(f"{what}: command, args and env are for stdio servers, not {transport}")
        out["url"] = _check_url(get_text(d, "url", what, required=True), what, strict)
        put(out, "headers", get_secret_map(d, "headers", what, runtime=strict) or None)
    else:
        allowed = "http, streamable-http" + ("" if strict else ", stdio")
        raise Refused(f"{what}: transport must be one of {allowed} (got {transport!r})")
    put(out, "description", get_text(d, "description", what))
    put(out, "tools", string_list(d.get("tools"), f"{what}: tools") or None)
    return out


@dataclass(frozen=True)
class MCPServerConnection:
    """What the MCP client needs to connect, with the references resolved.
    Never persisted, logged or returned over any API."""

    name: str
    transport: str
    url: str
    headers: dict[str, str]
    command: str
    args: tuple[str, ...]
    env: dict[str, str]
    tools: tuple[str, ...]


def mcp_server_connection(row: VersionedDef) -> MCPServerConnection:
    """Resolve an MCPServerDef row's `${NAME}` references from this process's
    environment. Only shared rows may hold references; a runtime-authored one
    only to LOOMCYCLE_* variables; none to the runtime's own secrets. Checked
    again here, not only at write time, so a row stored before a rule existed
    cannot leak a value. Raises Refused naming the offending field."""
    d = row.definition
    if row.tenant_id:
        check_tenant_refs(row.tenant_id, row.name, {k: d.get(k) for k in ("headers", "env")})
    runtime = row.source != DefSource.YAML
    denied = config_secret_names(runtime_config())

    def resolve(key: str) -> dict[str, str]:
        out = {}
        for k, v in (d.get(key) or {}).items():
            try:
                out[k] = resolve_references(v, runtime=runtime, denied=denied)
            except ValueError as exc:
                raise Refused(f"mcp server {row.name!r}: {key}.{k}: {exc}") from exc
        return out

    return MCPServerConnection(
        name=row.name,
        transport=str(d.get("transport", "")),
        url=str(d.get("url", "")),
        headers=resolve("headers"),
        command=str(d.get("command", "")),
        args=tuple(d.get("args") or ()),
        env=resolve("env"),
        tools=tuple(d.get("tools") or ()),
    )


MCPSERVER = Kind(
    key="mcpserver",
    tool="MCPServerDef",
    model=MCPServerDef,
    pointer=MCPServerDefActive,
    ops=frozenset({"create", "fork", "get", "list", "retire", "promote", "verify"}),
    normalise=normalise_mcpserver,
    content_hash=hashing.mcp_content_sha256,
    yaml_key="mcp_servers",
    secret_fields=("headers", "env"),
)
