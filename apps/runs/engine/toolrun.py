"""Executing one iteration's tool calls under policy.

Calls run concurrently (LOOMCYCLE_TOOL_PARALLELISM, default 8). A call to a
tool outside the run's effective set, bad input, or an exception inside the
tool becomes an `is_error` result the model sees; nothing here fails a run.
Results come back in completion order (the order events are emitted).
An allowed call goes through the interceptors apps registered
(`registry.intercepted`, e.g. tool-use hooks) on the thread that runs it,
with no transaction open and the connection handed back first.
Every result leaves here storable (`_storable`): whatever a tool or a hook
returned, a NUL or a lone surrogate in its text or events cannot fail the
step's commit (Postgres text and jsonb refuse them).
"""

from __future__ import annotations

import contextvars
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from opentelemetry import context as otel_context

from apps.core import toolregistry as registry
from apps.core.database import connection_lost
from apps.core.http import storable, storable_text
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.gateway.providers import ToolCall
from apps.runs import tracing

log = logging.getLogger("loomcycle.tools")


@dataclass(frozen=True)
class CallOutcome:
    call: ToolCall
    result: ToolResult
    seconds: float = 0.0  # wall time of the call (policy checks, hooks and the tool), for metrics


def _timed(ctx: ToolContext, call: ToolCall, parent: otel_context.Context | None) -> CallOutcome:
    t0 = time.perf_counter()
    with tracing.tool_call(ctx, call, parent) as span:
        result = _execute_one(ctx, call)
        tracing.tool_result(span, result)
    return CallOutcome(call, result, time.perf_counter() - t0)


def _execute_one(ctx: ToolContext, call: ToolCall) -> ToolResult:
    return _storable(_execute_checked(ctx, call))


def _storable(result: ToolResult) -> ToolResult:
    """The one place tool output is made storable (NUL -> U+FFFD, lone surrogates escaped)."""
    text = storable_text(result.text)
    events = tuple(storable(list(result.events))) if result.events else result.events
    if text is result.text and events == result.events:
        return result
    return replace(result, text=text, events=events)


def _execute_checked(ctx: ToolContext, call: ToolCall) -> ToolResult:
    if call.name not in ctx.tools:
        return ToolResult(f"tool {call.name!r} is not allowed for this run", is_error=True)
    tool = registry.get(call.name, tenant_id=ctx.tenant_id)
    if tool is None:
        return ToolResult(f"tool {call.name!r} is not available on this runtime", is_error=True)
    if not isinstance(call.input, dict):
        return ToolResult(f"tool {call.name!r}: input must be a JSON object", is_error=True)
    return registry.intercepted(call.name, partial(_run_tool, tool))(ctx, call.input)


def _run_tool(tool: Tool, ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    """The tool itself; an exception inside it is the model's is_error result, except a lost
    database connection (a Postgres restart): not the tool's failure, so it ends the iteration
    uncommitted, and the engine hands the claim back and rings the step again (the tool runs
    again; apps.runs.engine.iterate._hand_back)."""
    try:
        return tool.execute(ctx, data)
    except Exception as exc:
        if connection_lost(exc):
            log.warning(
                "tool %s lost the database connection (run %s step %s); iteration abandoned",
                tool.name,
                ctx.run_id,
                ctx.step,
            )
            raise
        log.exception("tool %s raised (run %s step %s)", tool.name, ctx.run_id, ctx.step)
        return ToolResult(f"tool {tool.name!r} failed: {type(exc).__name__}: {exc}", is_error=True)


def _in_thread(ctx: ToolContext, call: ToolCall, parent: otel_context.Context | None) -> CallOutcome:
    close_old_connections()
    try:
        return _timed(ctx, call, parent)
    finally:
        connection.close()  # hand this thread's connection back to the pool


def run_calls(base: ToolContext, calls: list[ToolCall]) -> list[CallOutcome]:
    """Run the calls; stop starting new ones once `base.cancelled` is set."""
    ctxs = {c.id: replace(base, call_id=c.id) for c in calls}
    parent = tracing.current()  # the iteration's span, for calls on pool threads (no context there)
    if len(calls) == 1:
        call = calls[0]
        return [_timed(ctxs[call.id], call, parent)]
    parallel = max(1, min(settings.LOOMCYCLE.tool_parallelism, len(calls)))
    outcomes: list[CallOutcome] = []
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="lc-tool") as pool:
        pending: dict[Future[CallOutcome], ToolCall] = {}
        queue = list(calls)
        while queue or pending:
            while queue and len(pending) < parallel and not base.cancelled.is_set():
                call = queue.pop(0)
                # In a copy of this context: the iteration's log fields reach the tool's thread.
                pending[pool.submit(contextvars.copy_context().run, _in_thread, ctxs[call.id], call, parent)] = call
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                pending.pop(fut)
                outcomes.append(fut.result())
    return outcomes
