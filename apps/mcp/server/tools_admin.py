"""Definition and admin tools: `agentdef`, `skilldef` and `mcpserverdef` run the def
tools' op-dispatch as `POST /v1/_agentdef` / `/v1/_skilldef` / `/v1/_mcpserverdef` do
(the operator plane: the caller's tenant, every name scope; substrate:tenant), through
the same service entry (`def_dispatch_async`: an MCP server's discovery is awaited on
the event loop, holding no thread), and
`pause` / `resume` / `state` are the runtime's `/v1/_pause`, `/v1/_resume`,
`/v1/_state` (substrate:admin, so hidden from tenant principals).

A refused op is an error result with code `tool_refused` (or `not_found` for
an unknown or another tenant's def_id) naming the def tool, as over REST.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from apps.core.errors import ApplicationError
from apps.core.http import db_call
from apps.core.types import Principal
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.runs import selectors as run_selectors
from apps.runs import services as run_services
from apps.substrate import services as substrate
from apps.substrate.auth import ADMIN, TENANT
from apps.substrate.kinds import REFUSALS, Refusal, get_kind, refusal_details
from apps.substrate.schemas import DefOpIn


class DefOpArgs(DefOpIn, Args):
    """The def tools' common input (SPEC 6.5); each op reads what it needs, others pass through."""

    model_config = ConfigDict(extra="allow")  # as DefOpIn: Args refuses unknown fields


class DefRefused(ApplicationError):
    """A def op's refusal, naming the tool, with the refusal's status and code as over REST:
    422 `tool_refused` (or its own code), 404 `not_found`, 429 `tenant_quota_exceeded`."""

    def __init__(self, exc: Refusal, tool: str) -> None:
        super().__init__(exc.message, code=exc.code, details={**refusal_details(exc), "tool": tool})
        self.status = exc.status


def def_tool(key: str, name: str) -> McpTool:
    kind = get_kind(key)

    async def call(principal: Principal, args: DefOpArgs) -> dict[str, Any]:
        data = args.model_dump(exclude_unset=True)
        try:  # the service's async entry: a discovery's wait holds none of the web process's threads
            return await substrate.def_dispatch_async(kind, substrate.operator_author(principal), data)
        except REFUSALS as exc:
            raise DefRefused(exc, kind.tool) from exc

    ops = ", ".join(sorted(kind.ops))
    return McpTool(name, f"{kind.tool} op-dispatch ({ops}) in your tenant.", TENANT, DefOpArgs, call)


class PauseArgs(Args):
    timeout_ms: int = Field(default=30_000, ge=0, le=300_000, description="wait for in-flight iterations")


class NoArgs(Args):
    """A tool that takes no arguments (unknown ones are refused, as every Args)."""


async def pause(principal: Principal, args: PauseArgs) -> dict[str, Any]:
    return await run_services.runtime_pause(timeout_ms=args.timeout_ms)


async def resume(principal: Principal, args: NoArgs) -> dict[str, Any]:
    return await db_call(run_services.runtime_resume)()


def _state() -> dict[str, Any]:
    return {"state": run_services.runtime_state_get(), "paused_runs_count": run_selectors.paused_runs_count()}


async def state(principal: Principal, args: NoArgs) -> dict[str, Any]:
    return await db_call(_state)()


register(
    def_tool("agent", "agentdef"),
    def_tool("skill", "skilldef"),
    def_tool("mcpserver", "mcpserverdef"),
    McpTool("pause", "Park every run at its next boundary (runtime-wide).", ADMIN, PauseArgs, pause),
    McpTool("resume", "Resume parked runs after a pause (runtime-wide).", ADMIN, NoArgs, resume),
    McpTool("state", "The runtime's pause state and its paused runs count.", ADMIN, NoArgs, state),
)
