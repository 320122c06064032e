"""The OpenTelemetry GenAI semantic conventions, read from in-memory exporters: a run driven in
this process (the engine's real iteration, the mock provider over its wire) gives `chat <model>`
spans with gen_ai.provider.name and token usage, `execute_tool <name>` spans, the agent and
conversation on its run spans, and the two gen_ai.client.* histograms.

The tracer and the instruments are swapped for ones on local providers (monkeypatch), so no
process-global provider is installed (tests/core/test_tracing.py checks that none is by default)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from apps.core import genai
from apps.runs import tracing
from tests.factories.runs import drive, start

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

TOOL = {"tool": "Context", "input": {"op": "self"}}


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("loomcycle.runs"))
    monkeypatch.setattr(tracing, "_installed", True)
    monkeypatch.setattr(genai, "_token_usage", genai.instruments(meter)[0])
    monkeypatch.setattr(genai, "_duration", genai.instruments(meter)[1])
    yield spans, reader


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    metrics = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    return {m.name: list(m.data.data_points) for m in metrics}


def test_a_run_follows_the_genai_conventions(exported: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    spans, reader = exported
    run = start("scripted", f"MOCK_SCRIPT: {json.dumps([TOOL, {'text': 'done'}])}")
    assert drive(run.id).status == "completed"
    finished: list[ReadableSpan] = list(spans.get_finished_spans())
    by_name = {s.name: s for s in finished}

    root = by_name["run.create"].attributes or {}
    assert root["gen_ai.operation.name"] == "invoke_agent"
    assert (root["gen_ai.agent.name"], root["gen_ai.agent.id"]) == ("scripted", run.agent_id)
    assert root["gen_ai.conversation.id"] == run.session_id
    iterations = [s for s in finished if s.name == "run.iterate"]
    assert len(iterations) == 2 and all(
        (s.attributes or {})["gen_ai.conversation.id"] == run.session_id for s in iterations
    )

    chats = [s.attributes or {} for s in finished if s.name == "chat mock-script"]
    assert len(chats) == 2
    for chat in chats:
        assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.provider.name"] == "mock"
        assert "gen_ai.system" not in chat  # deprecated
        assert chat["gen_ai.request.model"] == "mock-script" and chat["gen_ai.usage.input_tokens"] > 0
        assert chat["gen_ai.usage.output_tokens"] > 0 and chat["gen_ai.agent.name"] == "scripted"

    tool = by_name["execute_tool Context"].attributes or {}
    assert (tool["gen_ai.operation.name"], tool["gen_ai.tool.name"], tool["gen_ai.tool.type"]) == (
        "execute_tool",
        "Context",
        "function",
    )

    points = _points(reader)
    usage = points["gen_ai.client.token.usage"]
    assert sorted(p.attributes["gen_ai.token.type"] for p in usage) == ["input", "output"]  # one series each
    assert all(p.count == 2 and p.attributes["gen_ai.provider.name"] == "mock" for p in usage)
    (duration,) = points["gen_ai.client.operation.duration"]
    assert duration.count == 2 and duration.attributes["gen_ai.request.model"] == "mock-script"
    assert duration.sum > 0
