"""The Gemini driver against a loopback server speaking streamGenerateContent (SSE).

Samples live in tests/gateway/fixtures/gemini (README there says where each
shape comes from). Requests are asserted as exact JSON."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

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
)
from apps.gateway.providers.gemini import GeminiProtocol, gemini_schema, thinking_config
from apps.gateway.providers.http import HttpProvider, ProviderConfig

FIXTURES = Path(__file__).parent / "fixtures" / "gemini"
MODEL = "gemini-2.5-flash"
PATH = f"/v1beta/models/{MODEL}:streamGenerateContent"
USER_HI = {"role": "user", "content": [{"type": "text", "text": "Say hello"}]}

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name", "format": "uri"},
            "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit"]},
            "when": {"$ref": "#/$defs/When"},
        },
        "required": ["city", "ghost"],
        "additionalProperties": False,
        "$defs": {"When": {"type": "string", "format": "date-time", "additionalProperties": False}},
    },
)
WEATHER_DECLARATION = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "nullable": True, "enum": ["celsius", "fahrenheit"]},
            "when": {"type": "string", "format": "date-time"},
        },
        "required": ["city"],
    },
}


def sse_events(name: str) -> list[bytes]:
    """A fixture split into its SSE events, so the server sends them one by one."""
    raw = (FIXTURES / name).read_bytes()
    return [event + b"\r\n\r\n" for event in raw.split(b"\r\n\r\n") if event]


@dataclass
class Fake:
    """What the fake Gemini saw, and a gate a stalled stream waits on (opened at teardown)."""

    server: HTTPServer
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return self.server.url_for("").rstrip("/")

    def provider(self, **config: Any) -> HttpProvider:
        cfg = ProviderConfig(id="gemini", driver="gemini", base_url=self.url + "/v1beta", api_key="k", **config)
        return HttpProvider(cfg, GeminiProtocol())

    def _record(self, request: Request) -> None:
        self.requests.append(
            {
                "path": request.path,
                "query": request.query_string.decode(),
                "key": request.headers.get("x-goog-api-key"),
                "body": json.loads(request.get_data()),
            }
        )

    def stream(self, *fixtures: str, stall_after: int | None = None) -> None:
        """Answer successive calls with successive fixtures; optionally stall after N events."""
        queue = list(fixtures)

        def handler(request: Request) -> Response:
            self._record(request)
            events = sse_events(queue.pop(0))

            def body() -> Iterator[bytes]:
                for i, event in enumerate(events):
                    if stall_after is not None and i == stall_after:
                        self.release.wait(10)
                        return
                    yield event

            return Response(body(), status=200, content_type="text/event-stream")

        self.server.expect_request(PATH, method="POST").respond_with_handler(handler)

    def error(self, status: int, fixture: str, headers: dict[str, str] | None = None) -> None:
        def handler(request: Request) -> Response:
            self._record(request)
            body = (FIXTURES / fixture).read_bytes()
            return Response(body, status=status, headers=headers or {}, content_type="application/json")

        self.server.expect_request(PATH, method="POST").respond_with_handler(handler)


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    state = Fake(server)
    try:
        yield state
    finally:
        state.release.set()
        server.clear()
        server.stop()


def request(messages: list[dict[str, Any]] | None = None, **kw: Any) -> ProviderRequest:
    return ProviderRequest(model=MODEL, system=["Be brief."], messages=messages or [USER_HI], **kw)


def play(provider: HttpProvider, req: ProviderRequest, cancel: threading.Event | None = None) -> list[ProviderEvent]:
    return list(provider.stream(req, cancel or threading.Event()))


def aplay(provider: HttpProvider, req: ProviderRequest) -> list[ProviderEvent]:
    async def collect() -> list[ProviderEvent]:
        return [event async for event in provider.astream(req)]

    return asyncio.run(collect())


def raises(call: Callable[[], object]) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        call()
    return info.value


# --- streaming answers ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_plain_text_streams_deltas_then_done_with_usage(fake: Fake, path: str) -> None:
    fake.stream("text.sse")
    provider = fake.provider()
    events = play(provider, request()) if path == "blocking" else aplay(provider, request())
    assert events[:3] == [TextDelta("Hello"), TextDelta(", world"), TextDelta("!")]
    done = events[3]
    assert isinstance(done, Done) and len(events) == 4
    assert done.stop_reason == "end_turn"
    assert done.thinking == ()
    assert done.usage.as_dict() == {
        "input_tokens": 1200 - 1024,
        "output_tokens": 9 + 40,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1024,
        "model": MODEL,
        "provider": "gemini",
    }
    [seen] = fake.requests
    assert (seen["path"], seen["query"], seen["key"]) == (PATH, "alt=sse", "k")
    assert seen["body"] == {
        "contents": [{"role": "user", "parts": [{"text": "Say hello"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 4096},
    }


def test_request_carries_tools_sampling_and_thinking_budget(fake: Fake) -> None:
    fake.stream("text.sse")
    sampling = {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "stop": "END",
    }
    req = ProviderRequest(
        model=MODEL,
        system=["Be brief.", "", "Use tools."],
        messages=[USER_HI],
        tools=[WEATHER, ToolSpec(name="now", description="The time.", input_schema={"type": "object"})],
        max_tokens=1000,
        sampling=sampling,
        effort="high",
    )
    play(fake.provider(), req)
    assert fake.requests[0]["body"] == {
        "contents": [{"role": "user", "parts": [{"text": "Say hello"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use tools."}]},
        "tools": [{"functionDeclarations": [WEATHER_DECLARATION, {"name": "now", "description": "The time."}]}],
        "generationConfig": {
            "maxOutputTokens": 1000,
            "temperature": 0.2,
            "topP": 0.9,
            "topK": 40,
            "seed": 7,
            "frequencyPenalty": 0.5,
            "presencePenalty": 0.25,
            "stopSequences": ["END"],
            "thinkingConfig": {"thinkingBudget": 500, "includeThoughts": True},  # 8192 capped at max_tokens/2
        },
    }


@pytest.mark.parametrize(
    ("model", "effort", "max_tokens", "expected"),
    [
        ("gemini-2.5-flash", "", 4096, None),
        ("gemini-2.5-flash", "low", 4096, {"thinkingBudget": 0, "includeThoughts": False}),
        ("gemini-2.5-flash", "medium", 4096, {"thinkingBudget": 2048, "includeThoughts": True}),
        ("gemini-2.5-pro", "low", 4096, {"thinkingBudget": 128, "includeThoughts": True}),
        ("gemini-2.5-pro", "high", 0, {"thinkingBudget": 8192, "includeThoughts": True}),
        ("gemini-3-pro-preview", "medium", 4096, {"thinkingLevel": "high", "includeThoughts": True}),
        ("gemini-3-flash-preview", "medium", 4096, {"thinkingLevel": "medium", "includeThoughts": True}),
        ("gemini-3-flash-preview", "low", 4096, {"thinkingLevel": "low", "includeThoughts": True}),
        ("gemini-2.0-flash", "high", 4096, None),
        ("gemma-3-27b-it", "high", 4096, None),
    ],
)
def test_effort_maps_to_the_models_thinking_control(
    model: str, effort: str, max_tokens: int, expected: dict[str, Any] | None
) -> None:
    assert thinking_config(model, effort, max_tokens) == expected


def test_schema_keeps_geminis_subset_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "mode": {"const": "fast"},
            "n": {"type": "integer", "enum": [1, 2], "exclusiveMinimum": 0, "format": "int64"},
            "tags": {"type": "array", "items": {"type": "string", "additionalProperties": False}},
            "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "both": {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}], "type": "object"},
            "loop": {"$ref": "#/definitions/Loop"},
        },
        "definitions": {"Loop": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Loop"}}}},
    }
    assert gemini_schema(schema) == {
        "type": "object",
        "properties": {
            "mode": {"enum": ["fast"]},
            "n": {"type": "integer", "format": "int64"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "number"}]},
            "both": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            "loop": {"type": "object", "properties": {"next": {"type": "object"}}},
        },
    }
    assert gemini_schema({"type": "object", "properties": {}, "additionalProperties": False}) is None


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_tool_call_round_trip_replays_names_and_thought_signature(fake: Fake, path: str) -> None:
    fake.stream("tool_call.sse", "text.sse")
    provider = fake.provider()
    ask = {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]}
    first = replace(request([ask]), tools=[WEATHER])
    events = play(provider, first) if path == "blocking" else aplay(provider, first)

    assert events[0] == ThinkingDelta("**Checking two cities**\n\nThe user wants Paris and Rome.")
    paris, rome, done = events[1], events[2], events[3]
    assert isinstance(paris, ToolCall) and isinstance(rome, ToolCall) and isinstance(done, Done)
    assert (paris.name, paris.input) == ("get_weather", {"city": "Paris", "unit": "celsius"})
    assert (rome.name, rome.input) == ("get_weather", {"city": "Rome", "unit": "celsius"})
    assert paris.id.startswith("lc-gem-1-") and rome.id.startswith("lc-gem-2-") and paris.id != rome.id
    assert done.stop_reason == "tool_use"
    assert done.usage.output_tokens == 30 + 60
    assert done.thinking == (
        {
            "type": "thinking",
            "thinking": "**Checking two cities**\n\nThe user wants Paris and Rome.",
            "signature": "c2lnLXBhcmFsbGVsLTE=",
            "tool_use_id": paris.id,
        },
    )

    # The engine's next turn: the calls (thinking block replayed), then their results.
    assistant = [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input} for call in (paris, rome)]
    results = [
        {"type": "tool_result", "tool_use_id": paris.id, "content": "18C, clear", "is_error": False},
        {
            "type": "tool_result",
            "tool_use_id": rome.id,
            "content": [{"type": "text", "text": "no data"}],
            "is_error": True,
        },
    ]
    second = ProviderRequest(
        model=MODEL,
        system=[],
        messages=[
            first.messages[0],
            {"role": "assistant", "content": [*done.thinking, *assistant]},
            {"role": "user", "content": results},
        ],
        tools=[WEATHER],
    )
    events = play(provider, second) if path == "blocking" else aplay(provider, second)
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "end_turn"
    assert fake.requests[1]["body"] == {
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
            {
                "role": "model",
                "parts": [
                    {
                        "functionCall": {"name": "get_weather", "args": {"city": "Paris", "unit": "celsius"}},
                        "thoughtSignature": "c2lnLXBhcmFsbGVsLTE=",
                    },
                    {"functionCall": {"name": "get_weather", "args": {"city": "Rome", "unit": "celsius"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"output": "18C, clear"}}},
                    {"functionResponse": {"name": "get_weather", "response": {"error": "no data"}}},
                ],
            },
        ],
        "tools": [{"functionDeclarations": [WEATHER_DECLARATION]}],
        "generationConfig": {"maxOutputTokens": 4096},
    }


def test_a_signature_without_a_call_id_goes_on_the_first_call_or_the_last_part() -> None:
    thinking = {"type": "thinking", "thinking": "", "signature": "s1"}
    msgs: list[dict[str, Any]] = [
        USER_HI,
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "go on"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "c"},
                {"type": "tool_use", "id": "x", "name": "t", "input": {}},
                thinking,
            ],
        },
    ]
    cfg = ProviderConfig(id="gemini", driver="gemini", base_url="http://127.0.0.1:9/v1beta")
    contents = GeminiProtocol().build(cfg, request(msgs)).body["contents"]
    assert contents[1]["parts"] == [{"text": "a"}, {"text": "b", "thoughtSignature": "s1"}]
    assert contents[3]["parts"] == [
        {"text": "c"},
        {"functionCall": {"name": "t", "args": {}}, "thoughtSignature": "s1"},
    ]


def test_a_tool_result_without_its_tool_use_is_a_permanent_error(fake: Fake) -> None:
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}
    err = raises(lambda: play(fake.provider(), request([USER_HI, orphan])))
    assert err.status == 400 and not err.retryable
    assert "'nope'" in str(err)
    assert fake.requests == []


@pytest.mark.parametrize(
    ("fixture", "stop"),
    [("safety.sse", "refusal"), ("prompt_blocked.sse", "refusal"), ("max_tokens.sse", "max_tokens")],
)
def test_finish_reasons_map_to_stop_reasons(fake: Fake, fixture: str, stop: str) -> None:
    fake.stream(fixture)
    done = play(fake.provider(), request())[-1]
    assert isinstance(done, Done)
    assert done.stop_reason == stop


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_429_is_retryable_with_retry_after_and_geminis_message(fake: Fake, path: str) -> None:
    fake.error(429, "error_429.json", headers={"Retry-After": "7"})
    provider = fake.provider()
    err = raises(lambda: play(provider, request()) if path == "blocking" else aplay(provider, request()))
    assert (err.status, err.retryable, err.retry_after) == (429, True, 7.0)
    assert err.message == (
        "RESOURCE_EXHAUSTED: You exceeded your current quota, please check your plan and billing details. (retry in 7s)"
    )
    assert str(err).startswith("gemini 429: RESOURCE_EXHAUSTED")


def test_500_is_retryable_and_400_is_not(fake: Fake) -> None:
    fake.error(500, "error_500.json")
    err = raises(lambda: play(fake.provider(), request()))
    assert (err.status, err.retryable) == (500, True)
    assert err.message.startswith("INTERNAL: An internal error has occurred.")

    fake.server.clear()
    fake.error(400, "error_400.json")
    err = raises(lambda: play(fake.provider(), request()))
    assert (err.status, err.retryable) == (400, False)
    assert "should be non-empty for OBJECT type" in err.message
    assert err.message.startswith("INVALID_ARGUMENT: ")


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_malformed_frame_is_a_retryable_502(fake: Fake, path: str) -> None:
    fake.stream("malformed.sse")
    provider = fake.provider()
    err = raises(lambda: play(provider, request()) if path == "blocking" else aplay(provider, request()))
    assert (err.status, err.retryable) == (502, True)
    assert "malformed stream frame" in err.message


def test_error_object_mid_stream_keeps_its_status(fake: Fake) -> None:
    fake.stream("midstream_error.sse")
    err = raises(lambda: play(fake.provider(), request()))
    assert (err.status, err.retryable) == (503, True)
    assert err.message == "UNAVAILABLE: The model is overloaded. Please try again later."


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_stream_ending_without_finish_reason_is_a_transport_error(fake: Fake, path: str) -> None:
    fake.stream("truncated.sse")
    provider = fake.provider()
    err = raises(lambda: play(provider, request()) if path == "blocking" else aplay(provider, request()))
    assert (err.status, err.retryable) == (0, True)
    assert str(err) == "gemini http: stream ended without a finishReason"


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_read_timeout_is_status_0(fake: Fake, path: str) -> None:
    fake.stream("text.sse", stall_after=1)
    provider = fake.provider(read_timeout_s=0.3)
    started = time.monotonic()
    err = raises(lambda: play(provider, request()) if path == "blocking" else aplay(provider, request()))
    assert (err.status, err.retryable) == (0, True)
    assert "timed out" in err.message
    assert time.monotonic() - started < 3


def test_cancel_while_stalled_raises_within_a_second(fake: Fake) -> None:
    fake.stream("text.sse", stall_after=1)
    provider = fake.provider(read_timeout_s=30)
    cancel = threading.Event()
    seen: list[ProviderEvent] = []
    outcome: list[BaseException] = []

    def consume() -> None:
        try:
            for event in provider.stream(request(), cancel):
                seen.append(event)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=consume)
    worker.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [TextDelta("Hello")]
    time.sleep(0.2)  # the server is now stalled mid-stream
    cancelled_at = time.monotonic()
    cancel.set()
    worker.join(timeout=2)
    assert not worker.is_alive()
    assert time.monotonic() - cancelled_at < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], ProviderCancelled)


def test_cancel_before_the_call_sends_nothing(fake: Fake) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ProviderCancelled):
        play(fake.provider(), request(), cancel)
    assert fake.requests == []
