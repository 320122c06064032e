"""loomcycle's `evaluation` and `context` meta-tools: the agent-facing `Evaluation` and
`Context` tools' ops, run for the MCP caller instead of a run. There is no REST route for
either here, so each calls its tool's own implementation (no second one) with a context
that names the caller (its tenant and subject) and no run:

- `evaluation` holds `submit_any` and `read_any` in the caller's tenant (the operator
  plane's grant, apps.evaluations.tools.OPERATOR_GRANT); a submission's emitter role is
  `external` and its evaluator is `mcp:<subject>`.
- `context` answers the ops that do not describe a calling run (`agents`, `time`, `help`);
  `self`, `tools`, `history`, `skills` and `compact` need one and are refused.

A refusal (the tool's `is_error` text) is a 422 `tool_refused` error result naming the tool.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ConfigDict, Field

from apps.core.errors import ApplicationError
from apps.core.http import db_call
from apps.core.tools import ToolContext, ToolResult
from apps.core.types import Principal
from apps.evaluations.tools import OPERATOR_GRANT, evaluation_ops
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.runs.tools import context_execute
from apps.substrate.auth import TENANT

RUN_BOUND_CONTEXT_OPS = frozenset({"self", "tools", "history", "skills", "compact"})


class ToolRefused(ApplicationError):
    status = 422

    def __init__(self, message: str, tool: str) -> None:
        super().__init__(message, code="tool_refused", details={"tool": tool})


class OpArgs(Args):
    """`{op, ...}`: the tool checks every field (an unknown one is refused there)."""

    model_config = ConfigDict(extra="allow")
    op: str = Field(description="the tool's op")


def caller_context(principal: Principal) -> ToolContext:
    """A ToolContext for the MCP caller: its tenant and subject, no run, no agent, no tools."""
    return ToolContext(
        run_id="",
        agent_id="",
        session_id="",
        tenant_id=principal.tenant_id,
        user_id=principal.subject,
        agent_name=f"mcp:{principal.subject}",
        agent_def_id="",
        agent_def_sha256="",
        provider="",
        model="",
        step=0,
        call_id="",
        tools=(),
    )


def _answer(result: ToolResult, tool: str) -> dict[str, Any]:
    if result.is_error:
        raise ToolRefused(result.text, tool)
    body = json.loads(result.text)
    return body if isinstance(body, dict) else {"result": body}


def _evaluation(principal: Principal, args: OpArgs) -> dict[str, Any]:
    data = args.model_dump(exclude_unset=True)
    return _answer(evaluation_ops(caller_context(principal), data, list(OPERATOR_GRANT)), "Evaluation")


async def evaluation(principal: Principal, args: OpArgs) -> dict[str, Any]:
    return await db_call(_evaluation)(principal, args)


def _context(principal: Principal, args: OpArgs) -> dict[str, Any]:
    if args.op in RUN_BOUND_CONTEXT_OPS:
        raise ToolRefused(
            f"op {args.op!r} describes the calling run; over MCP there is none (use agents, time, help)", "Context"
        )
    return _answer(context_execute(caller_context(principal), args.model_dump(exclude_unset=True)), "Context")


async def context(principal: Principal, args: OpArgs) -> dict[str, Any]:
    return await db_call(_context)(principal, args)


register(
    McpTool(
        "evaluation",
        "Evaluation tool ops in your tenant (submit, get, list, list_for_run, list_for_def, aggregate); "
        "a submission is recorded with emitter_role external.",
        TENANT,
        OpArgs,
        evaluation,
    ),
    McpTool(
        "context",
        "Context tool ops that need no run: agents (your tenant's and the shared ones), time, help.",
        TENANT,
        OpArgs,
        context,
    ),
)
