"""The SDK's lowlevel `Server` over the tool table, and the run transcript resource.

The lowlevel server is used (not `MCPServer`) because the tool list depends
on the caller: `tools/list` shows only the tools the principal's scopes
allow. `principal_of(ctx)` says who is calling: the HTTP transport reads the
principal its auth put on the request; stdio has one fixed principal.

Resource template `loomcycle://runs/{run_id}/transcript`: a run's persisted
events (the transcript as the SSE stream replays it) as JSON, for a
principal with runs:read that may see the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from apps.core.errors import ApplicationError
from apps.core.http import db_call
from apps.core.timefmt import ts
from apps.core.types import Principal
from apps.mcp.server import (  # noqa: F401  (they register their tools)
    tools_admin,
    tools_agentops,
    tools_channels,
    tools_data,
    tools_fanout,
    tools_lifecycle,
    tools_ops,
    tools_runs,
)
from apps.mcp.server.tooltable import invoke, visible_tools
from apps.runs import selectors
from apps.substrate.auth import RUNS_READ, has_scope

Ctx = ServerRequestContext[Any, Any]
PrincipalOf = Callable[[Ctx], Principal]

TRANSCRIPT_TEMPLATE = "loomcycle://runs/{run_id}/transcript"
_TRANSCRIPT_URI = re.compile(r"loomcycle://runs/([A-Za-z0-9_-]{1,128})/transcript")
TRANSCRIPT_MAX_EVENTS = 5000


def _transcript(principal: Principal, run_id: str) -> dict[str, Any]:
    run = selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    rows = selectors.run_events_since(run_id=run.id, from_seq=0, limit=TRANSCRIPT_MAX_EVENTS)
    events = [{**r, "created_at": ts(r["created_at"])} for r in rows]
    return {"run_id": run.id, "state": run.status, "last_seq": run.last_seq, "events": events}


async def read_transcript(principal: Principal, uri: str) -> types.ReadResourceResult:
    """The transcript resource; an unknown URI, a missing scope or a run the
    principal may not see is an INVALID_PARAMS error carrying the API's code."""
    found = _TRANSCRIPT_URI.fullmatch(uri)
    if found is None:
        raise MCPError(INVALID_PARAMS, f"unknown resource {uri!r}", {"code": "not_found"})
    if not has_scope(principal.scopes, RUNS_READ):
        raise MCPError(INVALID_PARAMS, f"resource needs scope {RUNS_READ!r}", {"code": "insufficient_scope"})
    try:
        body = await db_call(_transcript)(principal, found.group(1))
    except ApplicationError as exc:
        raise MCPError(INVALID_PARAMS, exc.message, exc.body()) from exc
    text = json.dumps(body, separators=(",", ":"), default=str)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    )


def build_server(principal_of: PrincipalOf) -> Server[Any]:
    """One lowlevel server; every handler asks `principal_of` who is calling."""

    async def list_tools(ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.wire() for t in visible_tools(principal_of(ctx))])

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await invoke(principal_of(ctx), params.name, params.arguments)

    async def list_templates(
        ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="run-transcript",
            uri_template=TRANSCRIPT_TEMPLATE,
            description="A run's persisted events (its transcript) as JSON",
            mime_type="application/json",
        )
        visible = has_scope(principal_of(ctx).scopes, RUNS_READ)
        return types.ListResourceTemplatesResult(resource_templates=[template] if visible else [])

    async def list_resources(ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])  # runs are many: reach one through the template

    async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await read_transcript(principal_of(ctx), str(params.uri))

    return Server(
        "loomcycle",
        version="1",
        instructions="The loomcycle agent runtime: start and follow runs, memory, channels, definitions.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resource_templates=list_templates,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
