"""Writes and actions of the MCP client.

Invariants:
- `DiscoveredTools` is written only here, one row per MCPServerDef version;
  a failed re-discovery keeps the tools last listed and records the error;
- `rediscover` reaches only the caller's own tenant's servers (a shared one: admins);
- discovery runs at registration (MCPServerDef create/fork with `discover`, default
  true), on `rediscover`, for yaml servers at boot, and when a server says its
  list changed; runs never trigger it (a run offers what the cache holds);
- an MCP call or a discovery holds no DB connection while it waits for the server
  (unless its caller is inside a transaction);
- every failure of a call is the caller's error result, with run credentials redacted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.core.egress import EgressRefused
from apps.core.http import storable, storable_text
from apps.core.tools import ToolRefusal
from apps.mcp import selectors
from apps.mcp.client import calls
from apps.mcp.client.servers import ServerSpec, run_host_refusal, server_spec
from apps.mcp.models import DiscoveredTools
from apps.substrate import services as substrate_services
from apps.substrate.kinds import Kind, Refused, RefusedNotFound
from apps.substrate.models import VersionedDef
from apps.tools.httpcall import redact_credentials

log = logging.getLogger("loomcycle.mcp")


MAX_TOOLS = 256  # tools kept of one server's list
MAX_DESCRIPTION_CHARS = 8 * 1024
MAX_SCHEMA_CHARS = 64 * 1024  # an input schema larger than this (as JSON) is replaced
MAX_ERROR_CHARS = 4 * 1024
OPEN_SCHEMA: dict[str, Any] = {"type": "object"}


def tools_storable(server: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a server listed, made fit for the cache and for providers: at most MAX_TOOLS
    tools; text storable in Postgres (no NUL, no lone surrogate: apps.core.http.storable);
    descriptions capped; an input schema that is not a JSON object with `type: object`, or
    is larger than MAX_SCHEMA_CHARS, replaced by `{"type": "object"}` (logged)."""
    if len(tools) > MAX_TOOLS:
        log.warning("mcp server %r listed %d tools; the first %d are kept", server, len(tools), MAX_TOOLS)
    out = []
    for tool in tools[:MAX_TOOLS]:
        schema = tool.get("input_schema")
        if not _object_schema(schema):
            log.warning("mcp server %r: tool %r: input schema replaced by %s", server, tool.get("name"), OPEN_SCHEMA)
            schema = OPEN_SCHEMA
        description = str(tool.get("description") or "")[:MAX_DESCRIPTION_CHARS]
        out.append(storable({"name": str(tool["name"]), "description": description, "input_schema": schema}))
    return out


def _object_schema(schema: Any) -> bool:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    return len(json.dumps(schema, default=str)) <= MAX_SCHEMA_CHARS


def discovered_tools_store(*, row: VersionedDef, tools: list[dict[str, Any]] | None, error: str = "") -> None:
    """Record a discovery: `tools` None (it failed) keeps the previous list. What the
    server said is made storable first (`tools_storable`, the error capped)."""
    defaults: dict[str, Any] = {
        "tenant_id": row.tenant_id,
        "server": row.name,
        "error": storable_text(error[:MAX_ERROR_CHARS]),
        "discovered_at": timezone.now(),
    }
    if tools is not None:
        defaults["tools"] = tools_storable(row.name, tools)
    DiscoveredTools.objects.update_or_create(def_id=row.id, defaults=defaults)


def tools_relisted(spec: ServerSpec, tools: list[dict[str, Any]] | None) -> None:
    """A server said its list changed (called on the MCP loop's helper thread): store
    `tools` (a stdio session's re-list), or with None re-discover the server without
    any run's credentials (an HTTP session's headers may hold one run's)."""
    try:
        if tools is None:
            row = selectors.server_by_id(def_id=spec.def_id)
            if row is not None and not row.retired:
                mcp_server_discover(row=row)
            return
        stored = tools_storable(spec.name, tools)
        DiscoveredTools.objects.filter(def_id=spec.def_id).update(tools=stored, error="", discovered_at=timezone.now())
        log.info("mcp server %r: tools re-listed after list_changed (%d tools)", spec.name, len(tools))
    finally:
        connection.close()  # this thread's connection goes back; the thread is reused for other work


def mcp_server_discover(*, row: VersionedDef) -> dict[str, Any]:
    """tools/list on the server of `row` and store the answer; the report of what happened."""
    try:
        spec = server_spec(row, credentials=None)
        if not connection.in_atomic_block:
            connection.close()  # no DB connection is held while the server answers (reopened to store)
        tools = calls.list_tools(spec)
    except (Refused, EgressRefused, calls.McpCallFailed) as exc:
        reason = exc.message if isinstance(exc, Refused) else str(exc)
        discovered_tools_store(row=row, tools=None, error=reason)
        log.warning("mcp server %r (%s): discovery failed: %s", row.name, row.id, reason)
        return {"def_id": row.id, "name": row.name, "ok": False, "error": storable_text(reason), "tools": []}
    discovered_tools_store(row=row, tools=tools)
    names = [t["name"] for t in tools_storable(row.name, tools)]
    return {"def_id": row.id, "name": row.name, "ok": True, "tools": names}


def mcp_static_servers_discover() -> list[dict[str, Any]]:
    """Discover every shared yaml server not discovered yet (at boot)."""
    return [mcp_server_discover(row=row) for row in selectors.static_servers_undiscovered()]


# --- MCPServerDef ops this app adds or extends (installed into substrate at ready()) ---------


def _discover_flag(data: dict[str, Any]) -> bool:
    value = data.get("discover", True)
    if not isinstance(value, bool):
        raise Refused("discover must be true or false")
    return value


def _with_discovery(kind: Kind, out: dict[str, Any], discover: bool) -> dict[str, Any]:
    row = kind.model._default_manager.filter(id=out.get("def_id")).first()
    if discover and row is not None and not row.retired:
        out["discovery"] = mcp_server_discover(row=row)
    return out


def mcpserver_create(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Substrate's create, then (unless `discover: false`) tools/list on the new version."""
    discover = _discover_flag(data)
    return _with_discovery(kind, substrate_services.def_create(kind, author, data), discover)


def mcpserver_fork(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Substrate's fork, then (unless `discover: false`) tools/list on the new version."""
    discover = _discover_flag(data)
    return _with_discovery(kind, substrate_services.def_fork(kind, author, data), discover)


def mcpserver_rediscover(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`{"op": "rediscover", "name": ...}`: list the tools of the version `name` resolves to."""
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise Refused("rediscover: missing required field: name")
    row = selectors.server_resolve(tenant_id=author.tenant_id, name=name)
    if row is None:
        raise RefusedNotFound(f"rediscover: mcp server {name!r} not found")
    if row.tenant_id != author.tenant_id and not author.is_admin:
        raise Refused(f"rediscover: mcp server {name!r} is shared (the operator's); only an admin may rediscover it")
    return mcp_server_discover(row=row)


# --- calls -------------------------------------------------------------------------


@dataclass(frozen=True)
class CallOutcome:
    text: str
    is_error: bool


def mcp_call(
    *,
    row: VersionedDef,
    tool: str,
    args: dict[str, Any],
    credentials: dict[str, str],
    cancel: threading.Event | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> CallOutcome:
    """Call `tool` of the server of `row` with the caller's credentials filled into its
    headers; `cancel` (the run's) set abandons the call; `allowed_hosts` (the run's
    effective host list; None for a call made by no run) bounds a runtime-authored
    HTTP server. Never raises for the server's or the network's failures."""
    refusal = None if allowed_hosts is None else run_host_refusal(row, allowed_hosts)
    if refusal is not None:
        return CallOutcome(refusal, True)
    try:
        spec = server_spec(row, credentials=credentials)
    except (Refused, ToolRefusal) as exc:
        return CallOutcome(f"mcp server {row.name!r}: {exc}", True)
    if not connection.in_atomic_block:
        connection.close()  # no DB connection is held while the server works
    try:
        result = calls.call_tool(spec, tool, args, cancel)
    except calls.McpCallFailed as exc:
        text = f"mcp server {row.name!r}: tool {tool!r} failed: {exc}"
        return CallOutcome(redact_credentials(text, credentials), True)
    return CallOutcome(redact_credentials(calls.result_text(result), credentials), bool(result.is_error))
