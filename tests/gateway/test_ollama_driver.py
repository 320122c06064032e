"""The Ollama /api/chat driver (ollama cloud and ollama-local) against a
loopback server speaking the real NDJSON protocol. Recorded frame samples
live in fixtures/ollama/ (sources in its SOURCES.md)."""

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
from apps.gateway.providers.ollama import OllamaProtocol
from tests.gateway.wire import STALL, Collect, Wire, cancel_after, drain, play, serve

FIXTURES = Path(__file__).parent / "fixtures" / "ollama"
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather in a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


# --- the fake server (tests/gateway/wire.py) ---------------------------------


@pytest.fixture
def wire(server: HTTPServer) -> Iterator[Wire]:
    yield from serve(server, "/api/chat", "application/x-ndjson")


@pytest.fixture
def make_provider(wire: Wire) -> Iterator[Callable[..., HttpProvider]]:
    made: list[HttpProvider] = []

    def make(**overrides: Any) -> HttpProvider:
        fields: dict[str, Any] = {
            "id": "ollama-local",
            "driver": "ollama",
            "base_url": wire.url,
            "local": True,
            **overrides,
        }
        provider = HttpProvider(ProviderConfig(**fields), OllamaProtocol())
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.client().close()


# --- helpers ----------------------------------------------------------------


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def line(content: str = "", *, done: bool = False, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": "llama3.2", "message": {"role": "assistant", "content": content}, "done": done}
    return {**doc, **extra}


def ndjson(*docs: dict[str, Any], done: bool = True) -> bytes:
    if done:
        docs = (*docs, line(done=True, done_reason="stop", prompt_eval_count=5, eval_count=2))
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def request(messages: list[dict[str, Any]] | None = None, **kw: Any) -> ProviderRequest:
    return ProviderRequest(model="llama3.2", system=["Be terse."], messages=messages or [user("hi")], **kw)


# --- plain text and streaming -----------------------------------------------


def test_plain_text_sends_the_exact_request_and_yields_text_then_done(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(fixture("text.ndjson"))
    req = ProviderRequest(
        model="llama3.2",
        system=["You are terse.", "Answer in English."],
        messages=[user("Why is the sky blue?")],
        tools=[WEATHER],
        max_tokens=512,
        sampling={"temperature": 0.2, "top_p": 0.9, "top_k": 40, "seed": 101, "stop": "END"},
    )
    provider = make_provider(options={"num_ctx": 8192, "keep_alive": "10m"})
    events = collect(provider, req)

    assert wire.requests == [
        {
            "model": "llama3.2",
            "messages": [
                {"role": "system", "content": "You are terse.\n\nAnswer in English."},
                {"role": "user", "content": "Why is the sky blue?"},
            ],
            "stream": True,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Current weather in a city.",
                        "parameters": WEATHER.input_schema,
                    },
                }
            ],
            "options": {
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 101,
                "stop": ["END"],
                "num_predict": 512,
                "num_ctx": 8192,
            },
            "keep_alive": "10m",
        }
    ]
    assert "authorization" not in wire.headers[0]
    usage = Usage(input_tokens=26, output_tokens=3, model="llama3.2", provider="ollama-local")
    assert events == [
        TextDelta("The"),
        TextDelta(" sky"),
        TextDelta(" is blue."),
        Done(stop_reason="end_turn", usage=usage),
    ]


@pytest.mark.parametrize(("effort", "think"), [("high", True), ("medium", True), ("low", False)])
def test_ollama_cloud_sends_its_key_and_effort_becomes_think(
    wire: Wire, make_provider: Callable[..., HttpProvider], effort: str, think: bool
) -> None:
    wire.reply(ndjson(line("ok")))
    play(make_provider(id="ollama", api_key="k", local=False), request(effort=effort))
    assert wire.headers[0]["authorization"] == "Bearer k"
    assert wire.requests[0]["think"] is think


def test_no_effort_leaves_think_to_the_model(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    wire.reply(ndjson(line("ok")))
    play(make_provider(), request(max_tokens=0))
    assert "think" not in wire.requests[0]
    assert "options" not in wire.requests[0]  # nothing to set


def test_text_deltas_reach_the_caller_while_the_stream_is_still_open(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    gate = threading.Event()
    wire.reply(ndjson(line("one"), done=False), gate, ndjson(line(" two")))
    events = make_provider().stream(request(), threading.Event())

    first = next(events)  # the server is blocked on `gate`: this came off the open stream
    gate.set()
    assert first == TextDelta("one")
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(" two")]


def test_thinking_streams_as_thinking_and_length_is_max_tokens(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(fixture("thinking.ndjson"))
    events = collect(make_provider(), request(effort="high"))
    usage = Usage(input_tokens=11, output_tokens=64, model="deepseek-r1", provider="ollama-local")
    thinking = ({"type": "thinking", "thinking": "Count the r's: s-t-r-a-w-b-e-r-r-y has three.", "signature": ""},)
    assert events == [
        ThinkingDelta("Count the r's: "),
        ThinkingDelta("s-t-r-a-w-b-e-r-r-y has three."),
        TextDelta("Three."),
        Done(stop_reason="max_tokens", usage=usage, thinking=thinking),
    ]


# --- tool calls -------------------------------------------------------------


def test_tool_calls_round_trip_into_the_next_request(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    provider = make_provider()
    wire.reply(fixture("tool_call.ndjson"))
    first = collect(provider, request([user("Weather in Toronto?")], tools=[WEATHER]))

    call = first[0]
    assert isinstance(call, ToolCall)
    assert (call.name, call.input) == ("get_weather", {"city": "Toronto"})
    assert call.id.startswith("lc-")  # Ollama issues no ids: synthesized
    usage = Usage(input_tokens=122, output_tokens=33, model="qwen3", provider="ollama-local")
    assert first[1:] == [Done(stop_reason="tool_use", usage=usage)]  # done_reason "stop", but a tool was called

    history = [
        user("Weather in Toronto?"),
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "11C, rain", "is_error": False},
                {"type": "tool_result", "tool_use_id": "unknown-id", "content": "boom", "is_error": True},
                {"type": "text", "text": "Metric, please."},
            ],
        },
    ]
    wire.reply(ndjson(line("11C and rainy.")))
    collect(provider, request(history, tools=[WEATHER]))

    assert wire.requests[1]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Toronto?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Toronto"}}}],
        },
        {"role": "tool", "content": "11C, rain", "tool_name": "get_weather"},
        {"role": "tool", "content": "ERROR: boom"},  # no tool_use with that id: no name to give
        {"role": "user", "content": "Metric, please."},
    ]


def test_every_synthesized_tool_id_is_unique(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    calls = [{"function": {"name": "now", "arguments": {}}}, {"function": {"name": "now", "arguments": {}}}]
    two_calls = ndjson(line(message={"role": "assistant", "content": "", "tool_calls": calls}))
    wire.reply(two_calls)
    wire.reply(two_calls)
    provider = make_provider()
    ids = [e.id for e in play(provider, request()) + play(provider, request()) if isinstance(e, ToolCall)]
    assert len(ids) == 4
    assert len(set(ids)) == 4


def test_a_tool_id_sent_by_the_server_is_kept_and_string_arguments_are_parsed(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    call = {"id": "call_7", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    wire.reply(ndjson(line(message={"role": "assistant", "content": "", "tool_calls": [call]})))
    events = play(make_provider(), request())
    assert events[0] == ToolCall("call_7", "get_weather", {"city": "Oslo"})


def test_malformed_tool_call_arguments_are_a_502(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    call = {"function": {"name": "get_weather", "arguments": '{"city": '}}
    wire.reply(ndjson(line(message={"role": "assistant", "content": "", "tool_calls": [call]})))
    with pytest.raises(ProviderError) as caught:
        play(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (502, True)


def test_images_go_in_the_images_list_and_thinking_is_not_replayed(
    wire: Wire, make_provider: Callable[..., HttpProvider]
) -> None:
    history: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "a pig?", "signature": ""},
                {"type": "text", "text": "A pig."},
            ],
        },
        user("Sure?"),
    ]
    wire.reply(ndjson(line("Yes.")))
    play(make_provider(), request(history))
    assert wire.requests[0]["messages"][1:] == [
        {"role": "user", "content": "What is this?", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "A pig."},
        {"role": "user", "content": "Sure?"},
    ]


# --- errors -----------------------------------------------------------------


def test_a_missing_model_is_permanent_with_ollamas_message(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    message = 'model "llama9" not found, try pulling it first'
    wire.reply(json.dumps({"error": message}).encode(), status=404)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable, caught.value.message) == (404, False, message)
    assert str(caught.value) == f"ollama-local 404: {message}"


def test_429_with_retry_after_is_retryable_with_the_delay(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(b'{"error":"too many requests"}', status=429, headers={"Retry-After": "12"})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(id="ollama", api_key="k", local=False), request())
    err = caught.value
    assert (err.status, err.retryable, err.retry_after, err.message) == (429, True, 12.0, "too many requests")


def test_500_is_retryable(wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect) -> None:
    wire.reply(b'{"error":"llama runner process has terminated: signal: killed"}', status=500)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (500, True)
    assert caught.value.message == "llama runner process has terminated: signal: killed"


def test_400_is_permanent_and_carries_the_providers_message(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(b'{"error":"\\"llama3.2\\" does not support thinking"}', status=400)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request(effort="high"))
    assert (caught.value.status, caught.value.retryable) == (400, False)
    assert caught.value.message == '"llama3.2" does not support thinking'


def test_an_error_line_inside_the_stream_is_a_502(wire: Wire, make_provider: Callable[..., HttpProvider]) -> None:
    wire.reply(fixture("stream_error.ndjson"))
    seen: list[ProviderEvent] = []
    with pytest.raises(ProviderError) as caught:
        seen.extend(make_provider().stream(request(), threading.Event()))
    assert seen == [TextDelta("Partial")]
    assert (caught.value.status, caught.value.retryable) == (502, True)
    assert caught.value.message == "an error was encountered while running the model: unexpected EOF"


def test_a_malformed_line_is_a_retryable_502(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(b'{"model":"llama3.2","message":{"content":"ok"\n')
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(), request())
    assert (caught.value.status, caught.value.retryable) == (502, True)


def test_a_stream_cut_before_done_is_a_transport_error(
    wire: Wire, make_provider: Callable[..., HttpProvider], collect: Collect
) -> None:
    wire.reply(ndjson(line("The"), done=False))
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


def test_cancel_while_the_model_loads_raises_within_a_second(
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
    wire.reply(ndjson(line("The"), done=False), STALL)
    cancel = threading.Event()
    events = make_provider().stream(request(), cancel)
    assert next(events) == TextDelta("The")

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
