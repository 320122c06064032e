"""The mock provider's scripts, cancellation and failure injection (SPEC 7.5)."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from typing import Any

import pytest

from apps.gateway.providers.base import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ToolCall,
    ToolSpec,
)
from apps.gateway.providers.mock import MockProvider

FAST = "latency_ms=0&jitter_ms=0"


def request(model: str, messages: list[dict[str, Any]] | None = None, **kw: Any) -> ProviderRequest:
    msgs = messages if messages is not None else [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    return ProviderRequest(model=model, system=["be terse"], messages=msgs, **kw)


def rates(settings: Any, rate_429: float, rate_500: float) -> None:
    """The mock's injected failure rates (LOOMCYCLE_MOCK_429_RATE / _500_RATE) for this test."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, mock_429_rate=rate_429, mock_500_rate=rate_500)


def play(provider: MockProvider, req: ProviderRequest, cancel: threading.Event | None = None) -> list[ProviderEvent]:
    return list(provider.stream(req, cancel or threading.Event()))


def tool_turns(n: int, tool: str = "Context") -> list[dict[str, Any]]:
    """A transcript after `n` completed tool calls."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": tool, "input": {}}]})
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "r", "is_error": False}
        msgs.append({"role": "user", "content": [result]})
    return msgs


def test_generic_model_answers_ok_then_end_turn_with_usage() -> None:
    events = play(MockProvider("mock"), request(f"mock-generic?{FAST}"))
    assert events[0] == TextDelta("ok")
    assert len(events) == 2
    done = events[1]
    assert isinstance(done, Done)
    assert done.stop_reason == "end_turn"
    assert done.usage.input_tokens >= 1
    assert done.usage.output_tokens == 0  # len("ok") // 4
    assert (done.usage.provider, done.usage.model) == ("mock", f"mock-generic?{FAST}")


def test_unknown_mock_model_behaves_like_generic() -> None:
    events = play(MockProvider("mock"), request(f"mock-whatever?{FAST}"))
    assert events[0] == TextDelta("ok")
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "end_turn"


def test_input_tokens_grow_with_the_request() -> None:
    small = play(MockProvider("mock"), request(f"mock-generic?{FAST}"))[-1]
    big_msgs = [{"role": "user", "content": [{"type": "text", "text": "x" * 4000}]}]
    big = play(MockProvider("mock"), request(f"mock-generic?{FAST}", big_msgs))[-1]
    assert isinstance(small, Done) and isinstance(big, Done)
    assert big.usage.input_tokens > small.usage.input_tokens + 900


@pytest.mark.parametrize("step", [0, 1])
def test_tool_loop_calls_the_tool_until_calls_reached(step: int) -> None:
    model = f"mock-tool-loop?tool=Grep&calls=2&{FAST}"
    events = play(MockProvider("mock"), request(model, tool_turns(step, "Grep")))
    assert len(events) == 2
    call, done = events
    assert isinstance(call, ToolCall)
    assert call.name == "Grep"
    assert call.input == {"call": step}
    assert re.fullmatch(r"mock_tu_[0-9a-f]{16}", call.id)
    assert isinstance(done, Done) and done.stop_reason == "tool_use"
    assert done.usage.output_tokens >= 1


def test_tool_loop_answers_done_once_calls_are_used_up() -> None:
    events = play(MockProvider("mock"), request(f"mock-tool-loop?tool=Grep&calls=2&{FAST}", tool_turns(2, "Grep")))
    assert events[0] == TextDelta("done")
    assert not any(isinstance(e, ToolCall) for e in events)
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "end_turn"


def test_tool_loop_ids_are_fresh_per_call() -> None:
    provider = MockProvider("mock")
    ids = {play(provider, request(f"mock-tool-loop?tool=X&{FAST}"))[0].id for _ in range(5)}  # type: ignore[union-attr]
    assert len(ids) == 5


def test_step_counts_tool_results_in_user_messages_only() -> None:
    msgs = tool_turns(1)
    # A tool_result-typed block in an assistant message is not a completed step.
    msgs.append({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "z", "content": ""}]})
    events = play(MockProvider("mock"), request(f"mock-tool-loop?tool=Context&calls=2&{FAST}", msgs))
    assert isinstance(events[0], ToolCall)


def test_context_tool_input_is_self_inspection() -> None:
    call = play(MockProvider("mock"), request(f"mock-tool-loop?tool=Context&{FAST}"))[0]
    assert isinstance(call, ToolCall) and call.input == {"op": "self"}


def test_tool_loop_defaults_to_first_offered_tool_and_one_call() -> None:
    specs = [ToolSpec("Alpha", "a", {}), ToolSpec("Beta", "b", {})]
    first = play(MockProvider("mock"), request(f"mock-tool-loop?{FAST}", tools=specs))
    assert isinstance(first[0], ToolCall) and first[0].name == "Alpha"
    second = play(MockProvider("mock"), request(f"mock-tool-loop?{FAST}", tool_turns(1, "Alpha"), tools=specs))
    assert second[0] == TextDelta("done")


def test_tool_loop_without_any_tool_answers_done() -> None:
    events = play(MockProvider("mock"), request(f"mock-tool-loop?{FAST}"))
    assert events[0] == TextDelta("done")


def test_set_cancel_event_raises_cancelled_promptly() -> None:
    cancel = threading.Event()
    cancel.set()
    started = time.monotonic()
    with pytest.raises(ProviderCancelled):
        play(MockProvider("mock"), request("mock-generic?latency_ms=5000&jitter_ms=0"), cancel)
    assert time.monotonic() - started < 1.0


def test_cancel_during_wait_interrupts_the_latency() -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.05, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(ProviderCancelled):
            play(MockProvider("mock"), request("mock-generic?latency_ms=5000&jitter_ms=0"), cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 1.0


def test_cancel_is_honoured_even_with_zero_latency() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ProviderCancelled):
        play(MockProvider("mock"), request(f"mock-generic?{FAST}"), cancel)


def test_latency_option_delays_the_answer() -> None:
    started = time.monotonic()
    play(MockProvider("mock"), request("mock-generic?latency_ms=120&jitter_ms=0"))
    assert time.monotonic() - started >= 0.11


# --- failure injection -------------------------------------------------------------


def test_429_injection_raises_retryable_rate_limit(settings: Any) -> None:
    rates(settings, 1.0, 0.0)
    with pytest.raises(ProviderError) as exc:
        play(MockProvider("mock"), request(f"mock-generic?{FAST}"))
    err = exc.value
    assert (err.provider, err.status, err.retryable) == ("mock", 429, True)
    assert str(err).startswith("mock 429: rate_limited")
    assert err.retry_after is not None and err.retry_after > 0


def test_500_injection_raises_retryable_server_error(settings: Any) -> None:
    rates(settings, 0.0, 1.0)
    with pytest.raises(ProviderError) as exc:
        play(MockProvider("mock"), request(f"mock-generic?{FAST}"))
    assert (exc.value.status, exc.value.retryable) == (500, True)
    assert str(exc.value).startswith("mock 500: server_error")


def test_injected_failure_happens_before_any_event(settings: Any) -> None:
    provider = MockProvider("mock")
    stream = provider.stream(request(f"mock-generic?{FAST}"), threading.Event())
    rates(settings, 1.0, 0.0)  # set after the call: nothing has run until the first event is asked for
    with pytest.raises(ProviderError):
        next(stream)


@pytest.mark.parametrize(("r429", "r500"), [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5)])
def test_stable_provider_never_fails(settings: Any, r429: float, r500: float) -> None:
    rates(settings, r429, r500)
    provider = MockProvider("mock-stable", stable=True)
    for _ in range(20):
        events = play(provider, request(f"mock-generic?{FAST}"))
        assert isinstance(events[-1], Done) and events[-1].usage.provider == "mock-stable"


def test_zero_rates_never_fail(settings: Any) -> None:
    rates(settings, 0.0, 0.0)
    provider = MockProvider("mock")
    assert all(isinstance(play(provider, request(f"mock-generic?{FAST}"))[-1], Done) for _ in range(50))


# --- ProviderError ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (404, False), (422, False), (0, True), (429, True), (500, True), (503, True)],
)
def test_provider_error_retryable_only_for_429_5xx_and_transport(status: int, retryable: bool) -> None:
    err = ProviderError("anthropic", status, "boom")
    assert err.retryable is retryable
    # SPEC 7.1's classifiable text: "<provider> <status>:", or "<provider> http:" for transport failures
    assert str(err) == (f"anthropic {status}: boom" if status else "anthropic http: boom")
