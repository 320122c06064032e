"""The Anthropic Messages driver against a loopback server speaking the real
protocol (SSE samples in fixtures/anthropic, error bodies as documented at
https://docs.anthropic.com/en/api/errors), over both the blocking `stream`
and the async `astream` paths of the shared transport."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from apps.gateway.providers.anthropic import AnthropicDecoder, AnthropicProtocol
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
from apps.gateway.providers.http import Frame, HttpProvider, ProviderConfig

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
MODES = ["stream", "astream"]
MODEL = "claude-sonnet-4-5"
WEATHER = ToolSpec(
    name="get_weather",
    description="Get the current weather in a given location",
    input_schema={"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
)


def sse(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse_events(name: str) -> list[bytes]:
    """The fixture split into its SSE events (one network write each; the leading comment is one too)."""
    return [chunk + b"\n\n" for chunk in sse(name).split(b"\n\n") if chunk.strip()]


def held_after_first_delta(name: str, gate: threading.Event) -> list[bytes | threading.Event]:
    """The fixture's events with a stall right after the first text delta."""
    parts = sse_events(name)
    cut = next(i for i, part in enumerate(parts) if b'"text_delta"' in part) + 1
    return [*parts[:cut], gate, *parts[cut:]]


def error_body(kind: str, message: str) -> bytes:
    # shape from https://docs.anthropic.com/en/api/errors
    return json.dumps(
        {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    ).encode()


# --- the loopback server ----------------------------------------------------------


@dataclass
class Reply:
    """`parts`: bytes are written and flushed; an Event is waited on (a stall)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[bytes | threading.Event] = field(default_factory=list)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeAnthropic:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.release = threading.Event()  # set at teardown: ends every stall
        self.client_gone = 0  # connections the client cut (cancel, timeout)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.received.append(Received(self.path, headers, json.loads(raw)))
                reply = fake.replies.pop(0) if fake.replies else Reply(500, {}, [error_body("api_error", "unscripted")])
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "text/event-stream" if reply.status == 200 else "application/json")
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("connection", "close")
                    self.end_headers()
                    self.wfile.flush()
                    for part in reply.parts:
                        if isinstance(part, threading.Event):
                            part.wait(10)
                        else:
                            self.wfile.write(part)
                            self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    fake.client_gone += 1  # the client hung up mid-reply: what cancel/timeout tests provoke

            def log_message(self, format: str, *args: Any) -> None:
                return  # keep pytest output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def reply(self, *parts: bytes | threading.Event, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.replies.append(Reply(status, headers or {}, list(parts)))

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic()
    try:
        yield fake
    finally:
        fake.close()


def make_provider(url: str, **config: Any) -> HttpProvider:
    cfg = ProviderConfig(id="anthropic", driver="anthropic", base_url=url, api_key="test", **config)
    return HttpProvider(cfg, AnthropicProtocol())


@pytest.fixture
def provider(server: FakeAnthropic) -> Iterator[HttpProvider]:
    p = make_provider(server.url)
    try:
        yield p
    finally:
        p.client().close()


def request(messages: list[dict[str, Any]] | None = None, **kw: Any) -> ProviderRequest:
    msgs = messages if messages is not None else [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    return ProviderRequest(model=MODEL, system=["You are terse."], messages=msgs, **kw)


def play(
    provider: HttpProvider, req: ProviderRequest, mode: str, cancel: threading.Event | None = None
) -> tuple[list[ProviderEvent], Exception | None]:
    """Events received, and the exception that ended the stream (None = clean end)."""
    events: list[ProviderEvent] = []
    if mode == "stream":
        try:
            for event in provider.stream(req, cancel or threading.Event()):
                events.append(event)
        except (ProviderError, ProviderCancelled) as exc:
            return events, exc
        return events, None

    async def run() -> Exception | None:
        try:
            async for event in provider.astream(req):
                events.append(event)
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclient().aclose()
        return None

    return events, asyncio.run(run())


def collect(provider: HttpProvider, req: ProviderRequest, mode: str) -> list[ProviderEvent]:
    events, exc = play(provider, req, mode)
    if exc is not None:
        raise exc
    return events


def fails(provider: HttpProvider, req: ProviderRequest, mode: str) -> ProviderError:
    _, exc = play(provider, req, mode)
    assert isinstance(exc, ProviderError), f"expected a ProviderError, the stream ended with {exc!r}"
    return exc


def text_of(events: list[ProviderEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- answers ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_plain_text_answer_posts_messages_api_and_ends_with_done(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    server.reply(sse("text.sse"))
    events = collect(provider, request(), mode)

    assert events[:-1] == [TextDelta("Hello"), TextDelta("!"), TextDelta(" How can I help?")]
    assert events[-1] == Done(
        "end_turn",
        Usage(
            input_tokens=25,
            output_tokens=15,
            cache_creation_input_tokens=1200,
            cache_read_input_tokens=300,
            model=MODEL,
            provider="anthropic",
        ),
    )
    (got,) = server.received
    assert got.path == "/v1/messages"
    assert got.headers["x-api-key"] == "test"
    assert got.headers["anthropic-version"] == "2023-06-01"
    assert got.headers["content-type"] == "application/json"
    assert got.body == {
        "model": MODEL,
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        "stream": True,
    }


def test_text_deltas_reach_the_caller_while_the_stream_is_still_open(
    server: FakeAnthropic, provider: HttpProvider
) -> None:
    gate = threading.Event()
    server.reply(*held_after_first_delta("text.sse", gate))
    stream = provider.stream(request(), threading.Event())

    t0 = time.monotonic()
    first = next(stream)
    assert first == TextDelta("Hello")
    assert not gate.is_set()  # delivered while the server still holds the rest back
    assert time.monotonic() - t0 < 2.0
    gate.set()
    rest = list(stream)
    assert [e for e in rest if isinstance(e, TextDelta)] == [TextDelta("!"), TextDelta(" How can I help?")]
    assert isinstance(rest[-1], Done)


def test_async_text_deltas_reach_the_caller_while_the_stream_is_still_open(
    server: FakeAnthropic, provider: HttpProvider
) -> None:
    gate = threading.Event()
    server.reply(*held_after_first_delta("text.sse", gate))

    async def run() -> list[ProviderEvent]:
        stream = provider.astream(request())
        try:
            t0 = time.monotonic()
            first = await anext(stream)
            assert first == TextDelta("Hello")
            assert time.monotonic() - t0 < 2.0  # delivered while the server still holds the rest back
            gate.set()
            return [first] + [e async for e in stream]
        finally:
            await provider.aclient().aclose()

    events = asyncio.run(run())
    assert text_of(events) == "Hello! How can I help?"
    assert isinstance(events[-1], Done)


# --- tools ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_call_round_trip_sends_tool_use_and_tool_result_blocks(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    server.reply(sse("tool_use.sse"))
    server.reply(sse("text.sse"))
    user = {"role": "user", "content": [{"type": "text", "text": "Weather in SF?"}]}

    first = collect(provider, request([user], tools=[WEATHER]), mode)
    calls = [e for e in first if isinstance(e, ToolCall)]
    assert calls == [
        ToolCall(
            "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", {"location": "San Francisco, CA", "unit": "fahrenheit"}
        )
    ]
    done = first[-1]
    assert isinstance(done, Done)
    assert done.stop_reason == "tool_use"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (472, 89)

    call = calls[0]
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": text_of(first)},
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input},
        ],
    }
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "15 degrees, sunny", "is_error": False}
    second = collect(provider, request([user, assistant, {"role": "user", "content": [result]}], tools=[WEATHER]), mode)
    assert text_of(second) == "Hello! How can I help?"

    assert server.received[1].body == {
        "model": MODEL,
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in SF?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Okay, let's check the weather for San Francisco, CA:"},
                    {
                        "type": "tool_use",
                        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                        "name": "get_weather",
                        "input": {"location": "San Francisco, CA", "unit": "fahrenheit"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                        "content": "15 degrees, sunny",
                        "is_error": False,
                    }
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Get the current weather in a given location",
                "input_schema": {
                    "type": "object",
                    "properties": {"location": {"type": "string"}},
                    "required": ["location"],
                },
            }
        ],
        "stream": True,
    }


def test_tool_call_without_input_gets_an_empty_object(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(sse("empty_tool_input.sse"))
    events = collect(provider, request(), "stream")
    assert events[0] == ToolCall("toolu_01NoArgs000000000000000", "Context", {})
    assert isinstance(events[1], Done)
    assert events[1].stop_reason == "tool_use"


def test_consecutive_same_role_messages_merge_with_tool_results_first(
    server: FakeAnthropic, provider: HttpProvider
) -> None:
    server.reply(sse("text.sse"))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": 1}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok", "is_error": False}]},
        {"role": "user", "content": [{"type": "text", "text": "also this"}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True}],
        },
        {"role": "user", "content": [{"type": "text", "text": ""}]},  # empty text: refused by the API, dropped
    ]
    collect(provider, request(messages), "stream")

    sent = server.received[0].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok", "is_error": False},
        {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
        {"type": "text", "text": "also this"},
    ]


# --- thinking ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_thinking_streams_and_is_replayed_with_its_signature(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    server.reply(sse("thinking_tool_use.sse"))
    server.reply(sse("text.sse"))
    user = {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}
    sampling = {"temperature": 0.2, "top_k": 5, "top_p": 0.5}

    first = collect(provider, request([user], tools=[WEATHER], effort="high", sampling=sampling), mode)
    thoughts = [e for e in first if isinstance(e, ThinkingDelta)]
    assert thoughts == [
        ThinkingDelta("The user wants the weather in Paris."),
        ThinkingDelta("\nI should call get_weather with location Paris."),
    ]
    done = first[-1]
    assert isinstance(done, Done)
    signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+/=="
    thinking = {
        "type": "thinking",
        "thinking": "The user wants the weather in Paris.\nI should call get_weather with location Paris.",
        "signature": signature,
    }
    assert done.thinking == (thinking,)
    assert done.stop_reason == "tool_use"
    body = server.received[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert body["max_tokens"] > 8192
    assert not {"temperature", "top_k", "top_p"} & set(body)  # extended thinking refuses them

    (call,) = [e for e in first if isinstance(e, ToolCall)]
    # the engine may store reasoning after the call; the driver puts it first, as the API requires
    assistant = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}, *done.thinking],
    }
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18C", "is_error": False}
    collect(provider, request([user, assistant, {"role": "user", "content": [result]}], effort="high"), mode)

    assert server.received[1].body["messages"][1] == {
        "role": "assistant",
        "content": [
            thinking,
            {
                "type": "tool_use",
                "id": "toolu_01CswdEQBMshySk6Y9DFKrfq",
                "name": "get_weather",
                "input": {"location": "Paris"},
            },
        ],
    }


def test_redacted_thinking_is_kept_as_a_block_and_replayed_as_is(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(sse("redacted_thinking.sse"))
    server.reply(sse("text.sse"))
    first = collect(provider, request(effort="medium"), "stream")
    done = first[-1]
    assert isinstance(done, Done)
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qyP"}
    assert done.thinking == (redacted,)
    assert text_of(first) == "Done."

    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
        {"role": "assistant", "content": [*done.thinking, {"type": "text", "text": "Done."}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    collect(provider, request(messages, effort="medium"), "stream")
    assert server.received[1].body["messages"][1]["content"] == [redacted, {"type": "text", "text": "Done."}]


def test_thinking_without_a_signature_is_not_sent(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(sse("text.sse"))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
        # reasoning another provider produced: Anthropic would refuse an unsigned block
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "Hi"}],
        },
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    collect(provider, request(messages), "stream")
    assert server.received[0].body["messages"][1]["content"] == [{"type": "text", "text": "Hi"}]


@pytest.mark.parametrize(
    ("effort", "max_tokens", "thinking", "sent_max_tokens"),
    [
        ("", 4096, None, 4096),
        ("low", 4096, None, 4096),
        ("medium", 4096, {"type": "enabled", "budget_tokens": 2048}, 4096),
        ("high", 4096, {"type": "enabled", "budget_tokens": 8192}, 8192 + 4096),
        ("medium", 1000, {"type": "enabled", "budget_tokens": 2048}, 2048 + 1000),
    ],
)
def test_effort_maps_to_a_thinking_budget_below_max_tokens(
    effort: str, max_tokens: int, thinking: dict[str, Any] | None, sent_max_tokens: int
) -> None:
    config = ProviderConfig(id="anthropic", driver="anthropic", base_url="http://127.0.0.1:9", api_key="k")
    call = AnthropicProtocol().build(config, request(effort=effort, max_tokens=max_tokens))
    assert call.body.get("thinking") == thinking
    assert call.body["max_tokens"] == sent_max_tokens
    if thinking:
        assert call.body["max_tokens"] > thinking["budget_tokens"]


# --- request details ----------------------------------------------------------------


def test_cache_control_is_on_the_last_system_block_only(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(sse("text.sse"))
    server.reply(sse("text.sse"))
    req = ProviderRequest(model=MODEL, system=["agent prompt", "", "run metadata"], messages=request().messages)
    collect(provider, req, "stream")
    uncached = ProviderRequest(model=MODEL, system=["agent prompt"], messages=request().messages, cache_system=False)
    collect(provider, uncached, "stream")

    assert server.received[0].body["system"] == [
        {"type": "text", "text": "agent prompt"},
        {"type": "text", "text": "run metadata", "cache_control": {"type": "ephemeral"}},
    ]
    assert server.received[1].body["system"] == [{"type": "text", "text": "agent prompt"}]


def test_sampling_maps_stop_and_drops_keys_anthropic_lacks(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(sse("text.sse"))
    sampling = {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END", "STOP"],
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "seed": 7,
    }
    collect(provider, request(sampling=sampling), "stream")
    body = server.received[0].body
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "stop_sequences")} == {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END", "STOP"],
    }
    assert not {"stop", "frequency_penalty", "presence_penalty", "seed"} & set(body)


def test_untranslatable_block_fails_before_any_call_and_is_not_retryable(
    server: FakeAnthropic, provider: HttpProvider
) -> None:
    req = request([{"role": "user", "content": [{"type": "video", "url": "x"}]}])
    exc = fails(provider, req, "stream")
    assert (exc.status, exc.retryable) == (400, False)
    assert "video" in exc.message
    assert server.received == []


def test_capabilities_advertise_cache_thinking_effort_and_vision() -> None:
    p = make_provider("http://127.0.0.1:9")
    caps = p.capabilities
    assert (caps.streaming, caps.parallel_tools, caps.vision, caps.thinking) == (True, True, True, True)
    assert (caps.native_prompt_cache, caps.effort) == (True, True)


# --- errors -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_rate_limit_429_is_retryable_with_retry_after(server: FakeAnthropic, provider: HttpProvider, mode: str) -> None:
    body = error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")
    server.reply(body, status=429, headers={"retry-after": "7"})
    exc = fails(provider, request(), mode)
    assert (exc.status, exc.retryable, exc.retry_after) == (429, True, 7.0)
    assert "rate_limit_error: Number of request tokens has exceeded your per-minute rate limit" in exc.message
    assert str(exc).startswith("anthropic 429: ")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("status", "kind"), [(500, "api_error"), (529, "overloaded_error")])
def test_server_errors_are_retryable(
    server: FakeAnthropic, provider: HttpProvider, mode: str, status: int, kind: str
) -> None:
    server.reply(error_body(kind, "Internal server error" if status == 500 else "Overloaded"), status=status)
    exc = fails(provider, request(), mode)
    assert (exc.status, exc.retryable) == (status, True)
    assert exc.message.startswith(f"{kind}: ")


@pytest.mark.parametrize("mode", MODES)
def test_invalid_request_400_is_permanent_with_the_providers_message(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    message = 'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row'
    server.reply(error_body("invalid_request_error", message), status=400)
    exc = fails(provider, request(), mode)
    assert (exc.status, exc.retryable) == (400, False)
    assert exc.message == f"invalid_request_error: {message} (request_id req_011CSHoEeqs5C35K2UUqR7Fy)"


@pytest.mark.parametrize("mode", MODES)
def test_overloaded_error_event_mid_stream_is_a_retryable_529(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    server.reply(sse("overloaded_mid_stream.sse"))
    events, exc = play(provider, request(), mode)
    assert events == [TextDelta("Partial")]
    assert isinstance(exc, ProviderError)
    assert (exc.status, exc.retryable, exc.message) == (529, True, "overloaded_error: Overloaded")


@pytest.mark.parametrize(
    ("kind", "status"),
    [("overloaded_error", 529), ("rate_limit_error", 429), ("api_error", 500), ("invalid_request_error", 400)],
)
def test_stream_error_event_types_map_to_their_http_status(kind: str, status: int) -> None:
    config = ProviderConfig(id="anthropic", driver="anthropic", base_url="http://127.0.0.1:9")
    decoder = AnthropicDecoder(config, request())
    with pytest.raises(ProviderError) as info:
        decoder.feed(Frame("error", json.dumps({"type": "error", "error": {"type": kind, "message": "m"}})))
    assert (info.value.status, info.value.retryable) == (status, status != 400)


@pytest.mark.parametrize("mode", MODES)
def test_malformed_sse_data_is_a_retryable_502(server: FakeAnthropic, provider: HttpProvider, mode: str) -> None:
    head = sse_events("text.sse")[:2]
    server.reply(*head, b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {\n\n')
    exc = fails(provider, request(), mode)
    assert (exc.status, exc.retryable) == (502, True)
    assert "malformed stream frame" in exc.message


@pytest.mark.parametrize("mode", MODES)
def test_stream_without_message_stop_is_a_retryable_transport_error(
    server: FakeAnthropic, provider: HttpProvider, mode: str
) -> None:
    server.reply(sse("truncated.sse"))
    events, exc = play(provider, request(), mode)
    assert events == [TextDelta("Hello")]
    assert isinstance(exc, ProviderError)
    assert (exc.status, exc.retryable, exc.message) == (0, True, "stream ended before message_stop")


@pytest.mark.parametrize("mode", MODES)
def test_read_timeout_on_a_stalled_stream_is_a_retryable_status_0(server: FakeAnthropic, mode: str) -> None:
    server.reply(server.release)  # headers, then silence
    slow = make_provider(server.url, read_timeout_s=0.3)
    try:
        t0 = time.monotonic()
        exc = fails(slow, request(), mode)
        assert time.monotonic() - t0 < 5
    finally:
        slow.client().close()
    assert (exc.status, exc.retryable) == (0, True)
    assert "timed out" in exc.message


# --- cancel -----------------------------------------------------------------------


def test_cancel_while_waiting_for_the_first_byte_raises_promptly(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(server.release)  # 200 + headers, then the model "thinks" forever
    cancel = threading.Event()
    timer = threading.Timer(0.2, cancel.set)
    t0 = time.monotonic()
    timer.start()
    try:
        events, exc = play(provider, request(), "stream", cancel)
    finally:
        timer.cancel()
    assert isinstance(exc, ProviderCancelled)
    assert events == []
    assert time.monotonic() - t0 < 1.0


def test_async_stream_is_cancelled_by_cancelling_its_task(server: FakeAnthropic, provider: HttpProvider) -> None:
    server.reply(server.release)

    async def run() -> float:
        async def consume() -> list[ProviderEvent]:
            return [e async for e in provider.astream(request())]

        t0 = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consume(), 0.2)
            return time.monotonic() - t0
        finally:
            await provider.aclient().aclose()

    assert asyncio.run(run()) < 1.0


# --- decoder details ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "normalised"),
    [
        ("end_turn", "end_turn"),
        ("tool_use", "tool_use"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("refusal", "refusal"),
        ("pause_turn", "end_turn"),
    ],
)
def test_stop_reasons_are_normalised(wire: str, normalised: str) -> None:
    config = ProviderConfig(id="anthropic", driver="anthropic", base_url="http://127.0.0.1:9")
    decoder = AnthropicDecoder(config, request())
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": wire, "stop_sequence": None},
        "usage": {"output_tokens": 3},
    }
    assert decoder.feed(Frame("message_delta", json.dumps(delta))) == []
    assert decoder.feed(Frame("ping", '{"type": "ping"}')) == []
    (done,) = decoder.feed(Frame("message_stop", '{"type": "message_stop"}'))
    assert isinstance(done, Done)
    assert done.stop_reason == normalised
    assert done.usage.output_tokens == 3
    assert decoder.finish() == []
