"""MCP servers' tools as agent tools: the tool registry's provider (apps.core.toolregistry).

For a tenant, every MCPServerDef it can see (its own, then the shared ones)
offers the tools its cache row lists (narrowed by the def's `tools:` when set),
named `mcp__<server>__<tool>` (characters outside `[A-Za-z0-9_-]` become `_`).
They then pass the same policy as built-ins (operator floor, agent `tools:`
globs such as `mcp__time__*`, caller narrowing), the same hooks and redaction.
A database read per lookup; no server is contacted to list tools here.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from apps.core.tools import Tool, ToolContext, ToolResult
from apps.mcp import selectors, services
from apps.substrate.models import VersionedDef

PREFIX = "mcp__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    return f"{PREFIX}{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"


def mcp_tools(tenant_id: str) -> list[Tool]:
    """The tenant's MCP tools now, by server name then listing order; a name that
    comes twice (after the character mapping) keeps its first tool."""
    servers = selectors.servers_visible(tenant_id=tenant_id)
    cached = selectors.discovered_for(def_ids=[row.id for row in servers.values()])
    out: dict[str, Tool] = {}
    for row in servers.values():
        entry = cached.get(row.id)
        if entry is None:
            continue
        narrowed = set(row.definition.get("tools") or ())
        for listed in entry.tools:
            if narrowed and listed["name"] not in narrowed:
                continue
            tool = _tool(row, listed)
            out.setdefault(tool.name, tool)
    return list(out.values())


def _tool(row: VersionedDef, listed: dict[str, Any]) -> Tool:
    schema = listed.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        schema = {"type": "object"}  # a provider takes only object schemas (discovery replaces others too)
    return Tool(
        name=tool_name(row.name, listed["name"]),
        description=listed.get("description") or f"{listed['name']} (MCP server {row.name})",
        input_schema=schema,
        execute=partial(_execute, row, listed["name"]),
    )


def _execute(row: VersionedDef, tool: str, ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    outcome = services.mcp_call(
        row=row,
        tool=tool,
        args=data,
        credentials=dict(ctx.credentials),
        cancel=ctx.cancelled,
        allowed_hosts=ctx.allowed_hosts,
    )
    return ToolResult(outcome.text, is_error=outcome.is_error)
