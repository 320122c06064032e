"""Tool execution under policy: concurrency, completion order, errors as results."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apps.core import logcontext
from apps.core import toolregistry as registry
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.gateway.providers import ToolCall
from apps.runs.engine.toolrun import run_calls


def _sleep(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    time.sleep(float(data["s"]))
    return ToolResult(f"slept {data['s']} key={ctx.idempotency_key}")


def _boom(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    raise RuntimeError("kaboom")


# Every allowed call passes the tool-use hook chain, which reads the registrations
# (apps.triggers.hooks.cache): the calls need the database, on their own threads.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tools() -> Iterator[None]:
    added = [Tool("TSleep", "sleeps", {"type": "object"}, _sleep), Tool("TBoom", "raises", {"type": "object"}, _boom)]
    for tool in added:
        registry.register(tool)
    yield
    for tool in added:
        registry._REGISTRY.pop(tool.name, None)


def ctx(tools: tuple[str, ...], cancelled: threading.Event | None = None) -> ToolContext:
    return ToolContext(
        run_id="r_1",
        agent_id="a_1",
        session_id="s_1",
        tenant_id="",
        user_id="",
        agent_name="x",
        agent_def_id="def_1",
        agent_def_sha256="sha256:0",
        provider="mock",
        model="m",
        step=4,
        call_id="",
        tools=tools,
        cancelled=cancelled or threading.Event(),
    )


def test_calls_of_one_iteration_run_concurrently_and_report_in_completion_order(tools: None) -> None:
    calls = [
        ToolCall("c1", "TSleep", {"s": 0.6}),
        ToolCall("c2", "TSleep", {"s": 0.1}),
        ToolCall("c3", "TSleep", {"s": 0.3}),
    ]
    t0 = time.monotonic()
    outcomes = run_calls(ctx(("TSleep",)), calls)
    assert time.monotonic() - t0 < 1.0  # serial would be 1.0 s
    assert [o.call.id for o in outcomes] == ["c2", "c3", "c1"]
    assert outcomes[0].result.text == "slept 0.1 key=r_1:4:c2"  # (run_id, step, call_id)


def test_tool_threads_log_with_the_iterations_context(tools: None) -> None:
    """Parallel calls run on pool threads in a copy of the iteration's context
    (apps.core.logcontext), so their log records name the run too."""
    seen: dict[str, dict[str, Any]] = {}

    def _ids(tctx: ToolContext, data: dict[str, Any]) -> ToolResult:
        seen[tctx.call_id] = {**logcontext.current(), "thread": threading.current_thread().name}
        return ToolResult("ok")

    registry.register(Tool("TIds", "reports its log context", {"type": "object"}, _ids))
    try:
        with logcontext.bound(run_id="r_1", step=4, tenant="acme"):
            run_calls(ctx(("TIds",)), [ToolCall("c1", "TIds", {}), ToolCall("c2", "TIds", {})])
    finally:
        registry._REGISTRY.pop("TIds", None)
    assert {call: {k: v for k, v in s.items() if k != "thread"} for call, s in seen.items()} == {
        "c1": {"run_id": "r_1", "step": 4, "tenant": "acme"},
        "c2": {"run_id": "r_1", "step": 4, "tenant": "acme"},
    }
    assert all(s["thread"].startswith("lc-tool") for s in seen.values())


def test_a_raising_tool_becomes_an_error_result(tools: None) -> None:
    [outcome] = run_calls(ctx(("TBoom",)), [ToolCall("c1", "TBoom", {})])
    assert outcome.result.is_error and "RuntimeError: kaboom" in outcome.result.text


def test_tools_outside_the_runs_set_are_refused_as_error_results(tools: None) -> None:
    outcomes = run_calls(ctx(("TSleep",)), [ToolCall("c1", "TBoom", {}), ToolCall("c2", "Nope", {})])
    texts = {o.call.id: o.result for o in outcomes}
    assert texts["c1"].is_error and "not allowed" in texts["c1"].text
    assert texts["c2"].is_error and "not allowed" in texts["c2"].text


def test_no_new_call_starts_after_cancel(tools: None) -> None:
    cancelled = threading.Event()
    cancelled.set()
    calls = [ToolCall(f"c{i}", "TSleep", {"s": 0}) for i in range(3)]
    assert run_calls(ctx(("TSleep",), cancelled), calls) == []


def _backend_gone(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    """A tool whose own database connection is terminated under it, as a Postgres restart does."""
    import os

    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as own:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (own.info.backend_pid,))
        own.execute("SELECT 1")
    return ToolResult("unreachable: the connection was terminated")


def _times_out(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    import os

    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as own:
        own.execute("SET statement_timeout = 1")
        own.execute("SELECT pg_sleep(1)")
    return ToolResult("unreachable: the statement timed out")


def test_a_tool_that_loses_the_database_ends_the_iteration_instead_of_failing_the_call() -> None:
    import psycopg

    added = [
        Tool("TGone", "loses its db", {"type": "object"}, _backend_gone),
        Tool("TSlow", "times out", {"type": "object"}, _times_out),
    ]
    for tool in added:
        registry.register(tool)
    try:
        with pytest.raises(psycopg.OperationalError):
            run_calls(ctx(("TGone",)), [ToolCall("c1", "TGone", {})])
        (timed_out,) = run_calls(ctx(("TSlow",)), [ToolCall("c2", "TSlow", {})])  # not a lost connection
        assert timed_out.result.is_error and "QueryCanceled" in timed_out.result.text
    finally:
        for tool in added:
            registry._REGISTRY.pop(tool.name, None)
