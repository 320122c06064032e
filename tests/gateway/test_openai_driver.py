"""The OpenAI Chat Completions driver (OpenAI, DeepSeek, compatible servers)
against a loopback server speaking the real SSE protocol. Recorded frame
samples live in fixtures/openai/ (sources in its SOURCES.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from apps.gateway.providers.base import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from apps.gateway.providers.http import HttpProvider, ProviderConfig
from apps.gateway.providers.openai import OpenAIProtocol
from tests.gateway.wire import STALL, Collect, Wire, cancel_after, drain, play, serve

FIXTURES = Path(__file__).parent / "fixtures" / "openai"
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a place.",
    input_schema={"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
)


# --- the fake server (tests/gateway/wire.py) ---------------------------------


@pytest.fixture
def wire(server: HTTPServer) -> Iterator[Wire]:
    yield from serve(server, "/v1/chat/completions", "text/event-stream")


@pytest.fixture
def make_provider(wire: Wire) -> Iterator[Callable[..., HttpProvider]]:
    made: list[HttpProvider] = []

    def make(**overrides: Any) -> HttpProvider:
        fields: dict[str, Any] = {
            "id": "openai",
            "driver": "openai",
            "base_url": wire.url + "/v1",
            "api_key": "k",
            "dialect": "openai",
            **overrides,
        }
        provider = HttpProvider(ProviderConfig(**fields), OpenAIProtocol())
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.client().close()


# --- helpers ----------------------------------------------------------------


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4.1", "choices": [choice], **extra}


def sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    frames = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (frames + ("data: [DONE]\n\n" if done else "")).encode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def request(messages: list[dict[str, Any]] | None = None, **kw: Any) -> ProviderRequest:
    return ProviderRequest(model="gpt-4.1", system=["Be terse."], messages=messages or [user("hi")], **kw)


# --- plain text and streaming -----------------------------------------------


def test_plain_text_sends_the_exact_request_and_yields_text_then_done(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(fixture("text.sse"))
    req = ProviderRequest(
        model="gpt-4.1",
        system=["You are terse.", "Answer in English."],
        messages=[user("Say hello")],
        tools=[WEATHER],
        max_tokens=256,
        sampling={"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n\n"], "top_k": 40},
    )
    events = collect(make_provider(), req)

    assert wire.requests == [
        {
            "model": "gpt-4.1",
            "messages": [
                {"role": "system", "content": "You are terse.\n\nAnswer in English."},
                {"role": "user", "content": "Say hello"},
            ],
            "stream": True,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Current weather for a place.",
                        "parameters": WEATHER.input_schema,
                    },
                }
            ],
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 256,
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["\n\n"],
        }
    ]
    assert wire.headers[0]["authorization"] == "Bearer k"
    usage = Usage(
        input_tokens=11, output_tokens=2, cache_read_input_tokens=8, model="gpt-4o-2024-08-06", provider="openai"
    )
    assert events == [TextDelta("Hello"), TextDelta(" world"), Done(stop_reason="end_turn", usage=usage)]


def test_text_deltas_reach_the_caller_while_the_stream_is_still_open(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    gate = threading.Event()
    wire.reply(sse(chunk({"content": "one"}), done=False), gate, sse(chunk({"content": " two"}), chunk(finish="stop")))
    events = make_provider().stream(request(), threading.Event())

    first = next(events)  # the server is blocked on `gate`: this came off the open stream
    gate.set()
    assert first == TextDelta("one")
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(" two")]


def test_async_text_deltas_reach_the_caller_while_the_stream_is_still_open(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    gate = threading.Event()
    wire.reply(sse(chunk({"content": "one"}), done=False), gate, sse(chunk({"content": " two"}), chunk(finish="stop")))
    provider = make_provider()

    async def run() -> tuple[ProviderEvent, list[ProviderEvent]]:
        events = provider.astream(request())
        try:
            first = await anext(events)
            gate.set()
            return first, [e async for e in events]
        finally:
            await provider.aclient().aclose()

    first, rest = asyncio.run(run())
    assert first == TextDelta("one")
    assert rest[0] == TextDelta(" two")
    assert isinstance(rest[-1], Done)


def _split_mid_line(gate: threading.Event) -> list[bytes | threading.Event]:
    """A whole frame and half of the next (cut inside its JSON, and a CRLF stream cut between CR
    and LF), then, once `gate` is set, the rest: the second frame spans two reads."""
    one = sse(chunk({"content": "one"}), done=False).replace(b"\n", b"\r\n")
    two = sse(chunk({"content": " two"}), chunk(finish="stop")).replace(b"\n", b"\r\n")
    cut, cr = two.index(b"two"), two.index(b"\r\n") + 1
    return [one + two[:cut], gate, two[cut:cr], two[cr:]]


def test_a_frame_split_across_reads_mid_line_is_parsed_whole(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    gate = threading.Event()
    wire.reply(*_split_mid_line(gate))
    events = make_provider().stream(request(), threading.Event())
    first = next(events)  # the server holds the second frame's tail until `gate`
    gate.set()
    assert first == TextDelta("one")
    rest = list(events)
    assert rest[0] == TextDelta(" two") and isinstance(rest[-1], Done)


def test_async_a_frame_split_across_reads_mid_line_is_parsed_whole(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    gate = threading.Event()
    wire.reply(*_split_mid_line(gate))
    provider = make_provider()

    async def run() -> tuple[ProviderEvent, list[ProviderEvent]]:
        events = provider.astream(request())
        try:
            first = await anext(events)
            gate.set()
            return first, [e async for e in events]
        finally:
            await provider.aclient().aclose()

    first, rest = asyncio.run(run())
    assert first == TextDelta("one") and rest[0] == TextDelta(" two") and isinstance(rest[-1], Done)


# --- tool calls -------------------------------------------------------------


def test_tool_calls_round_trip_into_the_next_request(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    provider = make_provider()
    wire.reply(fixture("tool_calls.sse"))
    first = collect(provider, request([user("Weather and time in Paris?")], tools=[WEATHER]))

    calls = [e for e in first if isinstance(e, ToolCall)]
    assert calls == [
        ToolCall("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", {"location": "Paris, France"}),
        ToolCall("call_1rXrLs7iZCBDr4Dx8UQxvkrQ", "get_time", {"tz": "Europe/Paris"}),
    ]
    usage = Usage(input_tokens=82, output_tokens=41, model="gpt-4.1-2025-04-14", provider="openai")
    assert first[-1] == Done(stop_reason="tool_use", usage=usage)

    history = [
        user("Weather and time in Paris?"),
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                *({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": calls[0].id, "content": "18C, clear", "is_error": False},
                {"type": "tool_result", "tool_use_id": calls[1].id, "content": "clock offline", "is_error": True},
                {"type": "text", "text": "Also, hurry."},
            ],
        },
    ]
    wire.reply(sse(chunk({"content": "18C and clear."}), chunk(finish="stop")))
    collect(provider, request(history, tools=[WEATHER]))

    assert wire.requests[1]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location": "Paris, France"}'},
                },
                {
                    "id": "call_1rXrLs7iZCBDr4Dx8UQxvkrQ",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "content": "18C, clear"},
        {"role": "tool", "tool_call_id": "call_1rXrLs7iZCBDr4Dx8UQxvkrQ", "content": "ERROR: clock offline"},
        {"role": "user", "content": "Also, hurry."},
    ]


def test_history_edge_cases_translate_to_what_the_api_accepts(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    history: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "look closer", "signature": "sig"},
                {"type": "tool_use", "id": "call_1", "name": "zoom", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [], "is_error": False}],
        },
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""}]},
        {"role": "user", "content": "plain string content"},
    ]
    wire.reply(sse(chunk({"content": "A cat."}), chunk(finish="stop")))
    play(make_provider(), request(history))

    assert wire.requests[0]["messages"][1:] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        # a tool-calls-only turn has no content; thinking is dropped for OpenAI
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": ""},  # content is sent even when empty
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "plain string content"},
    ]


def test_an_unknown_content_block_is_refused_before_anything_is_sent(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    history = [{"role": "user", "content": [{"type": "audio", "data": "..."}]}]
    with pytest.raises(ProviderError) as caught:
        play(make_provider(), request(history))
    assert (caught.value.status, caught.value.retryable) == (400, False)
    assert "audio" in caught.value.message
    assert wire.requests == []


def test_empty_tool_arguments_become_an_empty_object(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "now", "arguments": ""}}
    wire.reply(sse(chunk({"tool_calls": [call]}), chunk(finish="tool_calls")))
    events = play(make_provider(), request())
    assert events[0] == ToolCall("call_9", "now", {})


@pytest.mark.parametrize("arguments", ['{"location": "Par', "[1, 2]"])
def test_tool_arguments_that_are_not_a_json_object_are_a_502(
    wire: Wire, make_provider: Callable[..., HttpProvider], arguments: str
) -> None:
    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    wire.reply(sse(chunk({"tool_calls": [call]}), chunk(finish="tool_calls")))
    with pytest.raises(ProviderError) as caught:
        play(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (502, True)
    assert "get_weather" in caught.value.message


@pytest.mark.parametrize(
    ("finish", "tool_call", "stop_reason"),
    [
        ("length", False, "max_tokens"),
        ("content_filter", False, "refusal"),
        ("stop", True, "tool_use"),  # compatible servers that say "stop" after tool calls
    ],
)
def test_finish_reasons_map_to_neutral_stop_reasons(
    wire: Wire, make_provider: Callable[..., HttpProvider], finish: str, tool_call: bool, stop_reason: str
) -> None:
    delta: dict[str, Any] = {"content": "x"}
    if tool_call:
        delta["tool_calls"] = [{"index": 0, "id": "c1", "function": {"name": "now", "arguments": "{}"}}]
    wire.reply(sse(chunk(delta), chunk(finish=finish)))
    events = play(make_provider(), request())
    assert isinstance(events[-1], Done)
    assert events[-1].stop_reason == stop_reason


# --- dialects ---------------------------------------------------------------


def test_deepseek_replays_reasoning_on_tool_call_turns_and_streams_reasoning(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    history = [
        user("Is 9.11 bigger than 9.8?"),
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should compute.", "signature": ""},
                {"type": "tool_use", "id": "call_0", "name": "calc", "input": {"expr": "9.11-9.8"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0", "content": "-0.69"}]},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "negative"}, {"type": "text", "text": "No."}],
        },
        user("Sure?"),
    ]
    wire.reply(fixture("deepseek_reasoning.sse"))
    provider = make_provider(id="deepseek", dialect="deepseek")
    events = collect(provider, ProviderRequest(model="deepseek-reasoner", system=[], messages=history, effort="high"))

    sent = wire.requests[0]
    assert "max_completion_tokens" not in sent and sent["max_tokens"] == 4096
    assert "reasoning_effort" not in sent
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][1] == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "9.11-9.8"}'}}
        ],
        "reasoning_content": "I should compute.",
    }
    assert sent["messages"][3] == {"role": "assistant", "content": "No."}  # no tool call: reasoning not sent
    usage = Usage(input_tokens=15, output_tokens=120, model="deepseek-reasoner", provider="deepseek")
    thinking = ({"type": "thinking", "thinking": "9.11 vs 9.8: 0.8 > 0.11.", "signature": ""},)
    assert events == [
        ThinkingDelta("9.11 vs 9.8: "),
        ThinkingDelta("0.8 > 0.11."),
        TextDelta("9.8 is greater."),
        Done(stop_reason="end_turn", usage=usage, thinking=thinking),
    ]


def test_deepseek_cache_hits_count_as_cache_reads(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_cache_hit_tokens": 64,
        "prompt_cache_miss_tokens": 36,
    }
    wire.reply(sse(chunk({"content": "ok"}), chunk(finish="stop", usage=usage)))
    done = play(make_provider(id="deepseek", dialect="deepseek"), request())[-1]
    assert isinstance(done, Done)
    assert (done.usage.input_tokens, done.usage.cache_read_input_tokens) == (36, 64)  # input excludes cache hits


def test_openai_dialect_maps_effort_to_reasoning_effort(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    wire.reply(sse(chunk({"content": "ok"}), chunk(finish="stop")))
    play(make_provider(), request(effort="low"))
    assert wire.requests[0]["reasoning_effort"] == "low"


def test_reasoning_under_the_name_reasoning_is_thinking(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    wire.reply(sse(chunk({"reasoning": "let me see"}), chunk({"content": "yes"}), chunk(finish="stop")))
    events = play(make_provider(dialect="compat"), request())
    assert events[:2] == [ThinkingDelta("let me see"), TextDelta("yes")]


def test_compat_server_without_key_usage_or_done_sentinel(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    wire.reply(sse(chunk({"content": "hi"}), chunk(finish="stop"), done=False))
    provider = make_provider(id="vllm", dialect="compat", api_key=None, options={"stream_usage": False})
    events = play(provider, request(effort="high", max_tokens=64))

    sent = wire.requests[0]
    assert "stream_options" not in sent and "reasoning_effort" not in sent
    assert sent["max_tokens"] == 64
    assert "authorization" not in wire.headers[0]
    assert events == [TextDelta("hi"), Done(stop_reason="end_turn", usage=Usage(model="gpt-4.1", provider="vllm"))]


# --- errors -----------------------------------------------------------------


def test_429_with_retry_after_is_retryable_with_the_delay(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    body = {"error": {"message": "Rate limit reached for gpt-4.1.", "type": "requests", "code": "rate_limit_exceeded"}}
    wire.reply(json.dumps(body).encode(), status=429, headers={"Retry-After": "7"})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    err = caught.value
    assert (err.status, err.retryable, err.retry_after) == (429, True, 7.0)
    assert str(err) == "openai 429: Rate limit reached for gpt-4.1."


def test_500_is_retryable(wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect) -> None:
    body = {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}
    wire.reply(json.dumps(body).encode(), status=500)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable, caught.value.retry_after) == (500, True, None)
    assert caught.value.message == "The server had an error while processing your request."


def test_400_is_permanent_and_carries_the_providers_message(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    message = "Invalid value for 'max_completion_tokens': must be at least 1."
    body = {"error": {"message": message, "type": "invalid_request_error", "param": "max_completion_tokens"}}
    wire.reply(json.dumps(body).encode(), status=400)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable, caught.value.message) == (400, False, message)


def test_a_malformed_frame_is_a_retryable_502(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(b'data: {"choices": [{"delta": {"content": "ok"\n\n')
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (502, True)


def test_an_error_chunk_inside_the_stream_carries_its_status(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    wire.reply(fixture("stream_error.sse"))
    seen: list[ProviderEvent] = []
    with pytest.raises(ProviderError) as caught:
        seen.extend(make_provider().stream(request(), threading.Event()))
    assert seen == [TextDelta("Part")]
    assert (caught.value.status, caught.value.message) == (503, "The engine is overloaded; try again later.")


def test_an_error_chunk_without_an_http_code_is_a_502(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    error = {"error": {"code": "server_error", "message": "Provider disconnected"}}
    wire.reply(sse(chunk({"content": "a"}), chunk({}, finish="error", **error)))
    with pytest.raises(ProviderError) as caught:
        play(make_provider(), request())
    assert (caught.value.status, caught.value.message) == (502, "Provider disconnected")


def test_a_stream_cut_before_the_reply_finished_is_a_transport_error(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(sse(chunk({"content": "Hel"}), done=False))
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (0, True)


def test_a_stalling_server_times_out_as_a_transport_error(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(stall_before_headers=True)
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(read_timeout_s=0.3), request())
    assert (caught.value.status, caught.value.retryable) == (0, True)
    assert "timed out" in caught.value.message
    assert time.monotonic() - started < 3.0


# --- cancellation -----------------------------------------------------------


def test_cancel_while_stalled_before_the_first_byte_raises_within_a_second(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    wire.reply(stall_before_headers=True)
    cancel = cancel_after(0.2)
    started = time.monotonic()
    with pytest.raises(ProviderCancelled):
        list(make_provider(read_timeout_s=3.0).stream(request(), cancel))
    assert time.monotonic() - started < 1.2


def test_cancel_while_stalled_mid_stream_raises_within_a_second(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    wire.reply(sse(chunk({"content": "Hel"}), done=False), STALL)
    cancel = threading.Event()
    events = make_provider().stream(request(), cancel)
    assert next(events) == TextDelta("Hel")

    threading.Timer(0.2, cancel.set).start()  # while the reader is blocked on the stalled socket
    started = time.monotonic()
    with pytest.raises(ProviderCancelled):
        next(events)
    assert time.monotonic() - started < 1.2


def test_cancelling_the_async_stream_while_stalled_ends_within_a_second(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    wire.reply(stall_before_headers=True)
    provider = make_provider()

    async def run() -> float:
        task = asyncio.create_task(drain(provider.astream(request())))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await provider.aclient().aclose()
        return time.monotonic() - started

    assert asyncio.run(run()) < 1.0
