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

import logging
import threading
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.core.egress import EgressRefused
from apps.core.tools import ToolRefusal
from apps.mcp import selectors
from apps.mcp.client import calls
from apps.mcp.client.servers import ServerSpec, server_spec
from apps.mcp.models import DiscoveredTools
from apps.substrate import services as substrate_services
from apps.substrate.kinds import Kind, Refused, RefusedNotFound
from apps.substrate.models import VersionedDef
from apps.tools.httpcall import redact_credentials

log = logging.getLogger("loomcycle.mcp")


def discovered_tools_store(*, row: VersionedDef, tools: list[dict[str, Any]] | None, error: str = "") -> None:
    """Record a discovery: `tools` None (it failed) keeps the previous list."""
    defaults: dict[str, Any] = {
        "tenant_id": row.tenant_id,
        "server": row.name,
        "error": error,
        "discovered_at": timezone.now(),
    }
    if tools is not None:
        defaults["tools"] = tools
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
        DiscoveredTools.objects.filter(def_id=spec.def_id).update(tools=tools, error="", discovered_at=timezone.now())
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
        return {"def_id": row.id, "name": row.name, "ok": False, "error": reason, "tools": []}
    discovered_tools_store(row=row, tools=tools)
    return {"def_id": row.id, "name": row.name, "ok": True, "tools": [t["name"] for t in tools]}


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
) -> CallOutcome:
    """Call `tool` of the server of `row` with the caller's credentials filled into its
    headers; `cancel` (the run's) set abandons the call. Never raises for the server's
    or the network's failures."""
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
