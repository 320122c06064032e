"""One trace per run (issue 23, "Tracing"): a web process and two worker processes
export over OTLP/HTTP to a receiver on loopback that speaks the real protocol
(protobuf `ExportTraceServiceRequest` on POST /v1/traces)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from celery import current_app
from mcp.client import Client
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from apps.runs.models import Run, RunStatus
from loomcycle_project import env as E
from loomcycle_project import telemetry
from tests.conftest import daphne, run_row, wait_for, wait_status
from tests.factories.grpc import grpc_server, grpc_stub, pb, user_text
from tests.factories.mcp import call, over_stdio
from tests.factories.observability import Receiver, Span, otel_env, otlp_receiver
from tests.procs import ROOT, WorkerPool
from workers import doorbell
from workers.queues import ITERATE_TASK, RUNS

SECRET_PROMPT = "the-words-of-this-prompt-stay-out-of-spans"
ITERATIONS = 5  # of the two-turn script (`_script`): three on one worker, two on the other
TOOL_STEPS = (0, 1, 3)  # the steps whose model turn calls a tool


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as server:
        yield server


@pytest.fixture(scope="module")
def traced(
    receiver: Receiver, workers: WorkerPool, stack_env: dict[str, str], logdir: Path
) -> Iterator[tuple[str, WorkerPool]]:
    """A traced web process and two traced workers (one task at a time each), exporting to
    `receiver`, for this module's tests; the session's untraced workers are stopped (as
    `no_workers` does) so that only these run iterations."""
    workers.stop()
    otel = otel_env(receiver)
    pool = WorkerPool({**stack_env, **otel}, logdir / "tracing", size=2, concurrency=1)
    pool.ensure()  # the workers start while the web process does
    try:
        # Three processes start at once on a shared host: the web one gets longer than the default.
        with daphne(stack_env, logdir, name="daphne-tracing", start_timeout=90, **otel) as base:
            wait_for(lambda: _consuming(pool.pids()), timeout=60)
            yield base, pool
    finally:
        pool.stop()


def _consuming(pids: list[int]) -> bool:
    """Every worker answers a ping (a consumer cancelled before its worker is up would still consume)."""
    return len(current_app.control.ping(timeout=1) or []) >= len(pids)


@contextmanager
def only_worker(n: int, of: int = 2) -> Iterator[None]:
    """Only worker `test<n>` of the traced pool consumes `runs` meanwhile (Celery remote control)."""
    host = socket.gethostname()
    others = [f"test{i}@{host}" for i in range(1, of + 1) if i != n]
    current_app.control.cancel_consumer(RUNS, destination=others, reply=True, timeout=5)
    try:
        yield
    finally:
        current_app.control.add_consumer(RUNS, destination=others, reply=True, timeout=5)


def _script() -> str:
    """Two turns of an interactive run: tool, tool, text (3 iterations); tool, text (2 more)."""
    tool = {"tool": "Context", "input": {"op": "self"}}
    steps = [tool, tool, {"text": "first turn"}, tool, {"text": "second turn"}]
    return f"{SECRET_PROMPT}. MOCK_SCRIPT: {json.dumps(steps)}"


def _run_spans(receiver: Receiver, run_id: str) -> list[Span]:
    """The spans once the whole run is in: its root, every iteration with its provider call."""
    spans = receiver.snapshot()
    iterations = [s for s in spans if s.name == "run.iterate" and s.attributes.get("loomcycle.run_id") == run_id]
    chats = [s for s in spans if s.name.startswith("chat ") and s.attributes.get("loomcycle.run_id") == run_id]
    roots = [s for s in spans if s.name == "run.create" and s.attributes.get("loomcycle.run_id") == run_id]
    request = [s for s in spans if roots and s.span_id == roots[0].parent_id]  # Django's server span
    complete = len(iterations) == ITERATIONS and len(chats) == ITERATIONS and request
    return spans if complete else []


@pytest.mark.usefixtures("agents")
def test_a_run_is_one_trace_from_its_request_across_workers(receiver: Receiver, traced: tuple[str, WorkerPool]) -> None:
    base, _ = traced
    with only_worker(1):  # the first turn on one worker, the second on the other
        run_id = _start(base, {"agent": "scripted", "prompt": _script(), "interactive": True})
        wait_status(run_id, RunStatus.AWAITING_INPUT, timeout=60)
    with only_worker(2):
        resp = httpx.post(f"{base}/v1/runs/{run_id}/input", json={"text": "go on"}, timeout=30)
        assert resp.status_code == 200, resp.text
        wait_for(lambda: (r := run_row(run_id)).step == ITERATIONS and r.status == RunStatus.AWAITING_INPUT, 60)
    try:
        spans = wait_for(lambda: _run_spans(receiver, run_id), timeout=20)
    except AssertionError:
        seen = sorted({(s.service, s.name, s.kind, s.parent_id != "") for s in receiver.snapshot()})
        raise AssertionError("spans received: " + "\n".join(map(str, seen))) from None
    by_id = {s.span_id: s for s in spans}

    (root,) = [s for s in spans if s.name == "run.create" and s.attributes["loomcycle.run_id"] == run_id]
    trace_id = root.trace_id
    assert run_row(run_id).trace_context.startswith(f"00-{trace_id}-{root.span_id}-")  # W3C traceparent
    request = by_id[root.parent_id]  # the creating request's server span (Django's instrumentation)
    assert request.service == "loomcycle-web" and request.kind == 2  # SERVER
    assert request.name == "POST v1/runs" and request.trace_id == trace_id

    iterations = sorted(
        (s for s in spans if s.name == "run.iterate" and s.attributes["loomcycle.run_id"] == run_id),
        key=lambda s: s.attributes["loomcycle.step"],
    )
    assert [s.attributes["loomcycle.step"] for s in iterations] == list(range(ITERATIONS))
    assert {s.trace_id for s in iterations} == {trace_id}
    assert {s.parent_id for s in iterations} == {root.span_id}  # each one a child of the run's root
    assert {s.service for s in iterations} == {"loomcycle-worker"}
    workers = [s.attributes["loomcycle.worker_id"] for s in iterations]
    assert len(set(workers[:3])) == len(set(workers[3:])) == 1 and workers[0] != workers[3]  # two workers
    assert len({s.instance for s in iterations}) == 2
    for it in iterations:  # linked to the Celery delivery that ran it, itself in the run's trace
        ((link_trace, link_span),) = it.links
        assert link_trace == trace_id and by_id[link_span].name == f"run/{ITERATE_TASK}"
    outcomes = [s.attributes["loomcycle.outcome"] for s in iterations]
    assert outcomes == ["requeue", "requeue", "park", "requeue", "park"]

    children = {it.span_id: [s for s in spans if s.parent_id == it.span_id] for it in iterations}
    for step, it in enumerate(iterations):
        (chat,) = [s for s in children[it.span_id] if s.name.startswith("chat ")]
        assert chat.trace_id == trace_id and chat.attributes["gen_ai.request.model"] == "mock-script"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        tools = [s for s in children[it.span_id] if s.name.startswith("execute_tool ")]
        if step in TOOL_STEPS:
            (tool,) = tools
            assert tool.attributes["gen_ai.tool.name"] == "Context" and tool.trace_id == trace_id
            assert tool.attributes["loomcycle.tool.is_error"] is False
        else:
            assert tools == []

    texts = [json.dumps([s.attributes, s.events, s.name]) for s in spans]
    assert not [t for t in texts if SECRET_PROMPT in t or "MOCK_SCRIPT" in t or "go on" in t]  # no prompt or input text


def _wake_spans(receiver: Receiver, run_id: str) -> list[Span]:
    """The spans once the woken turn is in: two iterations (the second after the wake), the wake,
    and every span they link to (the waking request, the woken delivery), each exported by its own
    process on its own schedule."""
    spans = receiver.snapshot()
    mine = [s for s in spans if s.attributes.get("loomcycle.run_id") == run_id]
    iterations = [s for s in mine if s.name == "run.iterate"]
    wakes = [s for s in mine if s.name == "run.wake"]
    received = {s.span_id for s in spans}
    linked = {span_id for s in iterations + wakes for _, span_id in s.links}
    return spans if len(iterations) == 2 and wakes and linked <= received else []


@pytest.mark.usefixtures("agents")
def test_a_park_and_its_wake_are_in_the_runs_trace(receiver: Receiver, traced: tuple[str, WorkerPool]) -> None:
    base, _ = traced
    script = json.dumps([{"text": "first turn"}, {"text": "second turn"}])
    body = {"agent": "scripted", "prompt": f"{SECRET_PROMPT}. MOCK_SCRIPT: {script}", "interactive": True}
    resp = httpx.post(f"{base}/v1/runs", json={**body, "background": True}, timeout=30)
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["run_id"]
    wait_status(run_id, RunStatus.AWAITING_INPUT, timeout=60)
    resp = httpx.post(f"{base}/v1/runs/{run_id}/input", json={"text": "go on"}, timeout=30)
    assert resp.status_code == 200, resp.text
    wait_for(lambda: run_row(run_id).step == 2 and run_row(run_id).status == RunStatus.AWAITING_INPUT, timeout=60)
    spans = wait_for(lambda: _wake_spans(receiver, run_id), timeout=20)
    by_id = {s.span_id: s for s in spans}

    (root,) = [s for s in spans if s.name == "run.create" and s.attributes["loomcycle.run_id"] == run_id]
    first, second = sorted(
        (s for s in spans if s.name == "run.iterate" and s.attributes["loomcycle.run_id"] == run_id),
        key=lambda s: s.attributes["loomcycle.step"],
    )
    assert first.attributes["loomcycle.outcome"] == "park"
    assert first.events == (("run.parked", {"loomcycle.status": "awaiting_input"}),)
    (wake,) = [s for s in spans if s.name == "run.wake" and s.attributes["loomcycle.run_id"] == run_id]
    assert (wake.trace_id, wake.parent_id) == (root.trace_id, root.span_id)
    assert wake.attributes["loomcycle.wake.reason"] == "input"
    ((waker_trace, waker_span),) = wake.links  # the request that woke it, in its own trace
    waker = by_id[waker_span]
    assert waker.service == "loomcycle-web" and waker_trace != root.trace_id
    assert (second.trace_id, second.parent_id) == (root.trace_id, root.span_id)
    ((_, delivery),) = second.links
    assert by_id[delivery].parent_id == wake.span_id  # the woken delivery came through the wake span
    texts = [json.dumps([s.attributes, s.events, s.name]) for s in spans]
    assert not [t for t in texts if SECRET_PROMPT in t or "go on" in t]


def _start(base: str, body: dict[str, Any]) -> str:
    resp = httpx.post(f"{base}/v1/runs", json={**body, "background": True}, timeout=30)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["run_id"])


def _named(spans: list[Span], name: str, run_id: str) -> list[Span]:
    return [s for s in spans if s.name == name and s.attributes.get("loomcycle.run_id") == run_id]


def _once_named(receiver: Receiver, name: str, run_id: str) -> list[Span]:
    """Every span received, once one named `name` of `run_id` is among them."""
    spans = receiver.snapshot()
    return spans if _named(spans, name, run_id) else []


@pytest.mark.usefixtures("agents")
def test_retries_and_a_fallback_are_events_of_the_provider_span(
    receiver: Receiver, traced: tuple[str, WorkerPool]
) -> None:
    base, _ = traced
    script = json.dumps([{"text": "answered by the fallback", "error": 429}])
    run_id = _start(base, {"agent": "scripted-fallback", "prompt": f"MOCK_SCRIPT: {script}"})
    wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    spans = wait_for(lambda: _once_named(receiver, "run.iterate", run_id), timeout=20)
    (iteration,) = _named(spans, "run.iterate", run_id)
    (chat,) = [s for s in spans if s.parent_id == iteration.span_id and s.name.startswith("chat ")]
    names = [name for name, _ in chat.events]
    assert names == ["provider.retry"] * 3 + ["provider.fallback"]
    retry = chat.events[0][1]
    assert (retry["loomcycle.provider"], retry["loomcycle.provider_status"], retry["loomcycle.attempt"]) == (
        "mock",
        429,
        1,
    )
    fallback = chat.events[-1][1]
    assert (fallback["loomcycle.failed_provider"], fallback["loomcycle.new_provider"]) == ("mock", "mock-stable")
    assert chat.attributes["gen_ai.provider.name"] == "mock-stable"  # the candidate that answered


@pytest.mark.usefixtures("agents")
def test_a_sub_agent_is_a_child_in_its_parents_trace(receiver: Receiver, traced: tuple[str, WorkerPool]) -> None:
    base, _ = traced
    parent_id = _start(base, {"agent": "spawner", "prompt": "spawn one"})
    wait_status(parent_id, RunStatus.COMPLETED, timeout=60)
    (child_id,) = Run.objects.filter(parent_id=parent_id).values_list("id", flat=True)

    def complete() -> list[Span]:
        spans = receiver.snapshot()
        whole = len(_named(spans, "run.iterate", parent_id)) == 2 and _named(spans, "run.iterate", child_id)
        created = _named(spans, "run.create", parent_id)  # the web's batch may come after the workers'
        return spans if whole and created and _named(spans, "run.wake", parent_id) else []

    spans = wait_for(complete, timeout=20)
    (root,) = _named(spans, "run.create", parent_id)
    spawning = min(_named(spans, "run.iterate", parent_id), key=lambda s: s.attributes["loomcycle.step"])
    (child_root,) = _named(spans, "run.create", child_id)
    assert (child_root.trace_id, child_root.parent_id) == (root.trace_id, spawning.span_id)
    assert child_root.attributes["loomcycle.parent_run_id"] == parent_id
    for it in _named(spans, "run.iterate", child_id):
        assert (it.trace_id, it.parent_id) == (root.trace_id, child_root.span_id)
    (wake,) = _named(spans, "run.wake", parent_id)  # the child's report answered the parent's parked call
    assert (wake.trace_id, wake.parent_id, wake.attributes["loomcycle.wake.reason"]) == (
        root.trace_id,
        root.span_id,
        "answer",
    )


@pytest.mark.usefixtures("agents")
def test_a_run_created_by_manage_py_mcp_is_rooted_there(
    receiver: Receiver, traced: tuple[str, WorkerPool], stack_env: dict[str, str], people: dict[str, dict[str, str]]
) -> None:
    """The stdio MCP server creates runs in its own process: their root spans are made (and exported) there."""
    token = people["alice"]["authorization"].removeprefix("Bearer ")
    spawn = {"agent": "scripted", "prompt": "MOCK_SCRIPT: " + json.dumps([{"text": "hi"}]), "wait": True}

    async def work(client: Client) -> tuple[bool, dict[str, Any]]:
        return await call(client, "spawn_run", {**spawn, "wait_seconds": 60})

    error, spawned = over_stdio(["mcp", "--token", token], {**stack_env, **otel_env(receiver)}, work)
    assert not error and spawned["status"] == "completed", spawned
    run_id = spawned["run_id"]
    spans = wait_for(lambda: _once_named(receiver, "run.create", run_id), timeout=20)
    (root,) = _named(spans, "run.create", run_id)
    assert root.service == "loomcycle-mcp"
    spans = wait_for(lambda: _once_named(receiver, "run.iterate", run_id), timeout=20)
    (iteration,) = _named(spans, "run.iterate", run_id)
    assert (iteration.trace_id, iteration.parent_id) == (root.trace_id, root.span_id)


def test_a_doorbell_carries_the_current_trace_context() -> None:
    """The hand-built doorbell puts `traceparent` where Celery's publish hook would (message headers)."""
    untraced = json.loads(doorbell.envelope(ITERATE_TASK, ("r_1", 0), RUNS))["headers"]
    assert "traceparent" not in untraced
    span = TracerProvider().get_tracer("test").start_span("ringer")  # a local provider: no global state
    with trace.use_span(span, end_on_exit=True):
        headers = json.loads(doorbell.envelope(ITERATE_TASK, ("r_1", 0), RUNS))["headers"]
    ctx = span.get_span_context()
    assert headers["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


def test_without_an_exporter_nothing_is_installed(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, tracing_exporters=())
    assert telemetry.setup("worker") is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@pytest.mark.parametrize(
    ("variables", "exporters"),
    [
        ({}, ()),  # no endpoint: nothing exported
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, ()),
    ],
)
def test_the_exporters_follow_the_otel_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], exporters: tuple[str, ...]
) -> None:
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert E.tracing_exporters() == exporters


def test_an_unknown_exporter_or_protocol_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(ImproperlyConfigured, match="jaeger"):
        E.tracing_exporters()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ImproperlyConfigured, match="grpc"):
        E.tracing_exporters()


_HOSTED = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "loomcycle_project.settings"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
host = TracerProvider()
trace.set_tracer_provider(host)
from loomcycle_project import telemetry
print(telemetry.setup("beat"), trace.get_tracer_provider() is host)
"""


def test_a_host_projects_tracer_provider_is_kept_without_otel_variables(stack_env: dict[str, str]) -> None:
    """In a fresh process (setup changes process-global state): no OTEL_* exporter, a host's provider."""
    env = {k: v for k, v in stack_env.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", _HOSTED], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def _grpc_spans(receiver: Receiver, run_id: str) -> list[Span]:
    """The spans once the run's root, its server span and its one iteration are in."""
    spans = receiver.snapshot()
    roots = [s for s in spans if s.name == "run.create" and s.attributes.get("loomcycle.run_id") == run_id]
    server = [s for s in spans if roots and s.span_id == roots[0].parent_id]
    iterations = [s for s in spans if s.name == "run.iterate" and s.attributes.get("loomcycle.run_id") == run_id]
    return spans if server and iterations else []


@pytest.mark.usefixtures("agents")
def test_a_run_created_over_grpc_is_one_trace_from_its_call(
    receiver: Receiver, traced: tuple[str, WorkerPool], stack_env: dict[str, str], logdir: Path
) -> None:
    """gRPC calls join a run's trace as HTTP requests do: the run's root is a child of the
    Run call's server span (the OTel gRPC interceptor of `manage.py grpc`)."""
    with (
        grpc_server({**stack_env, **otel_env(receiver)}, logdir / "grpc-traced.log") as target,
        grpc.insecure_channel(target) as channel,
    ):
        request = pb.RunRequest(agent="echo", segments=user_text(SECRET_PROMPT))
        events = list(grpc_stub(channel).Run(request, timeout=60))
    assert events[-1].type == "done"
    run_id = json.loads(events[1].error)["run_id"]  # the `agent` frame (apps.grpcapi.convert)
    spans = wait_for(lambda: _grpc_spans(receiver, run_id), timeout=20)
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if s.name == "run.create" and s.attributes["loomcycle.run_id"] == run_id]
    call = by_id[root.parent_id]
    assert (call.service, call.kind, call.trace_id) == ("loomcycle-grpc", 2, root.trace_id)  # SERVER
    assert call.name == "/loomcycle.v1.Loomcycle/Run"
    (iteration,) = [s for s in spans if s.name == "run.iterate" and s.attributes["loomcycle.run_id"] == run_id]
    assert (iteration.trace_id, iteration.parent_id) == (root.trace_id, root.span_id)
    assert not [s for s in spans if SECRET_PROMPT in json.dumps([s.attributes, s.events, s.name])]


@pytest.mark.usefixtures("agents")
def test_the_model_call_span_records_its_time_to_first_token(
    receiver: Receiver, traced: tuple[str, WorkerPool]
) -> None:
    """`gen_ai.server.time_to_first_token` (seconds): the mock waits 400 ms, then streams its reply
    in pieces 50 ms apart, so the first token comes after the wait and well before the last piece."""
    base, _ = traced
    step = {"sleep_ms": 400, "text": "one two three four five six seven eight", "chunk_chars": 4, "chunk_ms": 50}
    run_id = _start(base, {"agent": "scripted", "prompt": f"MOCK_SCRIPT: {json.dumps([step])}"})
    wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    spans = wait_for(lambda: _once_named(receiver, "run.iterate", run_id), timeout=20)
    (chat,) = [s for s in spans if s.name.startswith("chat ") and s.attributes.get("loomcycle.run_id") == run_id]
    ttft = chat.attributes["gen_ai.server.time_to_first_token"]
    assert 0.4 <= ttft < 0.4 + 9 * 0.05  # after the wait, before the ninth piece
