"""The MCP server's tool table: name, description, required scope, argument
schema and the coroutine that runs it for a principal.

A tool's argument schema parses (types, bounds, identifiers); its coroutine
calls services and selectors, which hold every rule. `visible_tools` is what
`tools/list` shows a principal; `invoke` refuses a tool the principal may not
use with `insufficient_scope`, so hiding is not the only gate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.db import DataError
from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from apps.core.errors import ApplicationError, Forbidden, Invalid, NotFound
from apps.core.http import check_storable
from apps.core.types import Principal
from apps.substrate.auth import has_scope

log = logging.getLogger("loomcycle.mcp.server")

ToolCall = Callable[[Principal, Any], Awaitable[dict[str, Any]]]


class Args(BaseModel):
    """Base of every tool's arguments: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    scope: str  # a scope of the closed catalog (apps.substrate.auth); "" = any authenticated principal
    args: type[Args]
    call: ToolCall

    def wire(self) -> types.Tool:
        schema = self.args.model_json_schema()
        schema.setdefault("properties", {})
        return types.Tool(name=self.name, description=self.description, input_schema=schema)


TOOLS: dict[str, McpTool] = {}


def register(*tools: McpTool) -> None:
    for tool in tools:
        if tool.name in TOOLS:
            raise RuntimeError(f"MCP tool {tool.name!r} registered twice")
        TOOLS[tool.name] = tool


def visible_tools(principal: Principal) -> list[McpTool]:
    """The tools `principal` may call, in registration order."""
    return [t for t in TOOLS.values() if has_scope(principal.scopes, t.scope)]


def _tool_for(principal: Principal, name: str) -> McpTool:
    tool = TOOLS.get(name)
    if tool is None:
        raise NotFound(f"unknown tool {name!r}", code="unknown_tool")
    if not has_scope(principal.scopes, tool.scope):
        raise Forbidden(f"tool {name!r} needs scope {tool.scope!r}", code="insufficient_scope")
    return tool


def _parse(tool: McpTool, arguments: dict[str, Any]) -> Any:
    check_storable(arguments)  # NUL, lone surrogates, nesting: 400 invalid_body, as a REST body
    try:
        return tool.args.model_validate(arguments)
    except PydanticValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        where = ".".join(str(p) for p in errors[0]["loc"]) or "arguments"
        raise Invalid(f"{where}: {errors[0]['msg']}", code="invalid_body", details={"errors": errors}) from exc


def result_of(body: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    """JSON as text (every client reads it) and as structured content."""
    text = json.dumps(body, separators=(",", ":"), default=str)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=body, is_error=is_error)


async def invoke(principal: Principal, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """Run one tool call; an ApplicationError (the REST API's 4xx/5xx) is an
    is_error result carrying its `code`, `error`, `details` and HTTP `status`."""
    try:
        tool = _tool_for(principal, name)
        return result_of(await tool.call(principal, _parse(tool, arguments or {})))
    except ApplicationError as exc:
        return result_of({**exc.body(), "status": exc.status}, is_error=True)
    except DataError as exc:  # as the REST handler: a value the store refused is the caller's 400
        log.warning("MCP tool %s: the store refused a value: %s", name, exc)
        message = "a value in the arguments cannot be stored (too long or out of range)"
        return result_of({"code": "invalid_value", "error": message, "details": {}, "status": 400}, is_error=True)
