"""Writes and actions of the MCP client.

Invariants:
- `DiscoveredTools` is written only here, one row per MCPServerDef version;
  a failed re-discovery keeps the tools last listed and records the error;
- `rediscover` reaches only the caller's own tenant's servers (a shared one: admins);
- discovery runs at registration (MCPServerDef create/fork with `discover`, default
  true), on `rediscover`, for yaml servers at boot, and when a server says its
  list changed; runs never trigger it (a run offers what the cache holds). Over
  an async transport (REST, the MCP server's `mcpserverdef`, both through
  substrate's `def_dispatch_async`) create, fork and rediscover are the `a*` twins:
  the answer still carries the discovery, but its wait is awaited on the event
  loop, so a slow or hostile server holds none of the web process's threads;
- an MCP call or a discovery holds no DB connection while it waits for the server
  (unless its caller is inside a transaction);
- every failure of a call is the caller's error result, with run credentials redacted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from apps.core.egress import EgressRefused
from apps.core.http import storable, storable_text
from apps.core.tools import ToolRefusal
from apps.mcp import selectors
from apps.mcp.client import calls
from apps.mcp.client.servers import ServerSpec, run_host_refusal, server_spec
from apps.mcp.client.sessions import MAX_TOOLS
from apps.mcp.models import DiscoveredTools
from apps.substrate import services as substrate_services
from apps.substrate.kinds import Kind, Refused, RefusedNotFound
from apps.substrate.models import VersionedDef
from apps.tools.httpcall import redact_credentials

log = logging.getLogger("loomcycle.mcp")
T = TypeVar("T")


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


_DISCOVERY_FAILED = (Refused, EgressRefused, calls.McpCallFailed)


def mcp_server_discover(*, row: VersionedDef) -> dict[str, Any]:
    """tools/list on the server of `row` and store the answer; the report of what happened."""
    try:
        spec = server_spec(row, credentials=None)
        if not connection.in_atomic_block:
            connection.close()  # no DB connection is held while the server answers (reopened to store)
        tools = calls.list_tools(spec)
    except _DISCOVERY_FAILED as exc:
        return discovery_record(row=row, tools=None, error=_failure(exc))
    return discovery_record(row=row, tools=tools)


def _failure(exc: Exception) -> str:
    return exc.message if isinstance(exc, Refused) else str(exc)


def discovery_record(*, row: VersionedDef, tools: list[dict[str, Any]] | None, error: str = "") -> dict[str, Any]:
    """Store a discovery's outcome (`tools` None: it failed with `error`); its report."""
    discovered_tools_store(row=row, tools=tools, error=error)
    if tools is None:
        log.warning("mcp server %r (%s): discovery failed: %s", row.name, row.id, error)
        return {"def_id": row.id, "name": row.name, "ok": False, "error": storable_text(error), "tools": []}
    names = [t["name"] for t in tools_storable(row.name, tools)]
    return {"def_id": row.id, "name": row.name, "ok": True, "tools": names}


async def amcp_server_discover(*, row: VersionedDef) -> dict[str, Any]:
    """mcp_server_discover for the event loop: the wait for the server holds no thread (the
    session runs on the MCP loop, calls.alist_tools); only the short DB writes take one."""
    store = sync_to_async(_closing(discovery_record), thread_sensitive=False)
    try:
        spec = await sync_to_async(_closing(server_spec), thread_sensitive=False)(row, credentials=None)
        tools = await calls.alist_tools(spec)
    except _DISCOVERY_FAILED as exc:
        return await store(row=row, tools=None, error=_failure(exc))
    return await store(row=row, tools=tools)


def _closing(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` that hands its thread's DB connection back when it returns (the thread is the pool's)."""

    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return run


def mcp_static_servers_discover() -> list[dict[str, Any]]:
    """Discover every shared yaml server not discovered yet (at boot)."""
    return [mcp_server_discover(row=row) for row in selectors.static_servers_undiscovered()]


# --- MCPServerDef ops this app adds or extends (installed into substrate at ready()) ---------


def _discover_flag(data: dict[str, Any]) -> bool:
    value = data.get("discover", True)
    if not isinstance(value, bool):
        raise Refused("discover must be true or false")
    return value


def _written(kind: Kind, author: Any, data: dict[str, Any], fork: bool) -> tuple[dict[str, Any], VersionedDef | None]:
    """The create or fork, and the row to discover (None: `discover: false`, or nothing to discover)."""
    discover = _discover_flag(data)
    out = (substrate_services.def_fork if fork else substrate_services.def_create)(kind, author, data)
    row = kind.model._default_manager.filter(id=out.get("def_id")).first()
    return out, row if discover and row is not None and not row.retired else None


async def _awritten_then_discovered(kind: Kind, author: Any, data: dict[str, Any], fork: bool) -> dict[str, Any]:
    out, row = await sync_to_async(_closing(_written), thread_sensitive=False)(kind, author, data, fork)
    if row is not None:
        out["discovery"] = await amcp_server_discover(row=row)
    return out


async def amcpserver_create(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """mcpserver_create for an async transport (REST): the same answer, no thread held while discovering."""
    return await _awritten_then_discovered(kind, author, data, fork=False)


async def amcpserver_fork(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    return await _awritten_then_discovered(kind, author, data, fork=True)


async def amcpserver_rediscover(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    row = await sync_to_async(_closing(_rediscoverable), thread_sensitive=False)(author, data)
    return await amcp_server_discover(row=row)


def mcpserver_create(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Substrate's create, then (unless `discover: false`) tools/list on the new version."""
    return _written_then_discovered(kind, author, data, fork=False)


def mcpserver_fork(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Substrate's fork, then (unless `discover: false`) tools/list on the new version."""
    return _written_then_discovered(kind, author, data, fork=True)


def _written_then_discovered(kind: Kind, author: Any, data: dict[str, Any], fork: bool) -> dict[str, Any]:
    out, row = _written(kind, author, data, fork)
    if row is not None:
        out["discovery"] = mcp_server_discover(row=row)
    return out


def mcpserver_rediscover(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`{"op": "rediscover", "name": ...}`: list the tools of the version `name` resolves to."""
    return mcp_server_discover(row=_rediscoverable(author, data))


def _rediscoverable(author: Any, data: dict[str, Any]) -> VersionedDef:
    """The row a rediscover names, if the author may rediscover it (else Refused)."""
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise Refused("rediscover: missing required field: name")
    row = selectors.server_resolve(tenant_id=author.tenant_id, name=name)
    if row is None:
        raise RefusedNotFound(f"rediscover: mcp server {name!r} not found")
    if row.tenant_id != author.tenant_id and not author.is_admin:
        raise Refused(f"rediscover: mcp server {name!r} is shared (the operator's); only an admin may rediscover it")
    return row


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
