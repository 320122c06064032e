"""The mock provider (SPEC 7.5): scripted, variable latency, 429/5xx injection.

Knobs come from LOOMCYCLE_MOCK_* (read once). Per call: roll the injected
failures, wait base + jitter + request_chars/100 us (cancel-aware), then play
the script picked by the model name at step = number of tool_result blocks
in the conversation.

The model string may carry options as a query string, e.g.
`mock-tool-loop?tool=Context&calls=2&latency_ms=2000`:
- `latency_ms`, `jitter_ms` override the process-wide latency for this model
  (clamped to 0..MAX_LATENCY_MS, so no option holds a connection and a
  fairness slot for hours);
- `rate_429`, `rate_500` override the injected failure rates for this model
  (clamped to 0..1);
- an option that is not a finite number (`latency_ms=x`) is refused where the
  model is named (`check_model`: 400 `invalid_model_options`) and, should one
  reach a call anyway, fails that call with a 400 ProviderError;
- `mock-tool-loop`: calls `tool` (default: the first offered tool) `calls`
  times (default 1), then answers "done" (for `tool=Agent`, `child` names the
  agent it spawns, default `echo`; `input` is the tool input as URL-encoded
  JSON, for any tool);
- the circuit roles (loomcycle's load-test harness; the circuit id is the
  first `cN` word in the user text, default `c0`; each step narrates, makes
  one tool call, and after the last step answers "done"):
  - `mock-researcher`: Memory set `<cid>-research`, Channel publish
    `research-done/<cid>`;
  - `mock-editor`: Channel subscribe `research-done/<cid>`, Memory get
    `<cid>-research`, Memory set `<cid>-research-edited`, Context self,
    Channel publish `editing-done/<cid>` with `editor_run_id` (the newest
    tool result's `run_id`, else `mock-editor-<cid>`);
  - `mock-evaluator`: Channel subscribe `editing-done/<cid>`, Memory get the
    research and the edited version, Memory set `<cid>-research-scored`,
    Evaluation submit for the editor's run (`editor_run_id` from the
    subscribe result, "" if none) with score
    0.50 + (fnv1a32(editor_run_id + cid) % 50) / 100 (0.85 for an empty seed);
- `mock-mem-search`: one Memory search (scope user, top_k 10, dedup drop at
  0.9), then "done";
- `mock-script`: the answers a test wrote into its prompt (`MOCK_SCRIPT: [...]`,
  see apps.gateway.providers.mock_script);
- `mock-generic` and anything unknown: text "ok", end_turn;
- `mock-crash` (only with LOOMCYCLE_MOCK_ALLOW_CRASH=1): SIGKILLs its own
  process mid-call, to test crash recovery.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from apps.core.ids import new_mock_tool_id
from apps.gateway import waits
from apps.gateway.providers import mock_chunks, mock_script
from apps.gateway.providers.base import (
    PURPOSE_COMPACTION,
    Capabilities,
    Done,
    Provider,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ToolCall,
    Usage,
)

MAX_LATENCY_MS = 300_000.0
MAX_CALLS = 1_000
# option -> (lower bound, upper bound): values outside are clamped to them.
_NUMERIC_BOUNDS: dict[str, tuple[float, float]] = {
    "latency_ms": (0.0, MAX_LATENCY_MS),
    "jitter_ms": (0.0, MAX_LATENCY_MS),
    "rate_429": (0.0, 1.0),
    "rate_500": (0.0, 1.0),
    "calls": (0.0, float(MAX_CALLS)),
}


@dataclass(frozen=True)
class MockOptions:
    """The model string's query options, numeric ones validated and clamped."""

    raw: dict[str, str]
    numbers: dict[str, float]

    def number(self, key: str, default: float) -> float:
        return self.numbers.get(key, default)

    def get(self, key: str, default: str = "") -> str:
        return self.raw.get(key, default)


def mock_options(query: str) -> MockOptions:
    """Parse a model's `?k=v&…` options; ValueError names a non-numeric one."""
    raw = {k: v[-1] for k, v in parse_qs(query).items()}
    numbers = {}
    for key, (low, high) in _NUMERIC_BOUNDS.items():
        if key not in raw:
            continue
        try:
            value = float(raw[key])
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ValueError(f"mock option {key} must be a number, got {raw[key][:40]!r}")
        numbers[key] = min(max(value, low), high)
    return MockOptions(raw, numbers)


def _parse_model(model: str) -> tuple[str, MockOptions]:
    base, _, query = model.partition("?")
    try:
        return base, mock_options(query)
    except ValueError as exc:
        raise ProviderError("mock", 400, f"{model[:80]}: {exc}") from exc


def _request_chars(request: ProviderRequest) -> int:
    return sum(len(s) for s in request.system) + len(json.dumps(request.messages))


def _tool_results(request: ProviderRequest) -> int:
    return sum(
        1 for m in request.messages if m["role"] == "user" for b in m["content"] if b.get("type") == "tool_result"
    )


class MockProvider(Provider):
    capabilities = Capabilities(streaming=False, parallel_tools=False, vision=True, remote=False)

    def __init__(self, provider_id: str, *, stable: bool = False) -> None:
        self.id = provider_id
        self.stable = stable
        self._rng = random.Random()

    def check_model(self, model: str) -> None:
        mock_options(model.partition("?")[2])

    def stream(self, request: ProviderRequest, cancel: threading.Event) -> Iterator[ProviderEvent]:
        variant, opts = _parse_model(request.model)
        chars = _request_chars(request)
        self._roll_failures(opts)
        seconds = self._latency(chars, opts)
        if seconds > 0:
            with waits.outside():  # simulated network time: the caller (the engine) may run another iteration
                if cancel.wait(seconds):
                    raise ProviderCancelled()
        if cancel.is_set():
            raise ProviderCancelled()
        if variant == "mock-crash" and settings.LOOMCYCLE.mock_allow_crash:
            os.kill(os.getpid(), signal.SIGKILL)
        if request.purpose == PURPOSE_COMPACTION:  # every variant summarises alike (docs/testing.md)
            yield from self._emit(mock_script.summary_text(request), [], request, chars, min_output=1)
            return
        if variant == "mock-script":
            scripted = mock_script.answer(self.id, request, stable=self.stable)
            if scripted.sleep_s > 0:
                with waits.outside():
                    if cancel.wait(scripted.sleep_s):
                        raise ProviderCancelled()
            *output, done = self._scripted(scripted, request, chars)
            yield from mock_chunks.played(output, scripted, request.run_id, cancel, self.id)
            if scripted.hold_s > 0:  # the turn's output is out; a cancel now cuts it there
                with waits.outside():
                    if cancel.wait(scripted.hold_s):
                        raise ProviderCancelled()
            yield mock_chunks.with_thinking(done, scripted)
            return
        yield from self._play(variant, opts, request, chars)

    async def astream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        variant, opts = _parse_model(request.model)
        chars = _request_chars(request)
        self._roll_failures(opts)
        seconds = self._latency(chars, opts)
        if seconds > 0:
            await asyncio.sleep(seconds)
        if variant == "mock-script":
            scripted = mock_script.answer(self.id, request, stable=self.stable)
            await asyncio.sleep(scripted.sleep_s)
            *output, done = self._scripted(scripted, request, chars)
            for event in output:
                yield event
            await asyncio.sleep(scripted.hold_s)
            yield done
            return
        for event in self._play(variant, opts, request, chars):
            yield event

    def _scripted(self, scripted: mock_script.Answer, request: ProviderRequest, chars: int) -> Iterator[ProviderEvent]:
        """A `mock-script` answer, after its wait: its failure, or its events
        (output tokens at least 1)."""
        if scripted.error is not None:
            raise scripted.error
        yield from self._emit(scripted.text, scripted.calls, request, chars, min_output=1)

    def _play(self, variant: str, opts: MockOptions, request: ProviderRequest, chars: int) -> Iterator[ProviderEvent]:
        step = _tool_results(request)
        text, calls = self._script(variant, opts, request, step)
        yield from self._emit(text, calls, request, chars)

    def _emit(
        self, text: str, calls: list[ToolCall], request: ProviderRequest, chars: int, *, min_output: int = 0
    ) -> Iterator[ProviderEvent]:
        if text:
            yield TextDelta(text)
        yield from calls
        out_tokens = len(text) // 4 + sum(len(_compact_json(c.input)) // 4 for c in calls)
        usage = Usage(
            input_tokens=max(1, chars // 4),
            output_tokens=max(min_output, out_tokens),
            model=request.model,
            provider=self.id,
        )
        yield Done(stop_reason="tool_use" if calls else "end_turn", usage=usage)

    def _roll_failures(self, opts: MockOptions) -> None:
        if self.stable:
            return
        rate_429 = opts.number("rate_429", settings.LOOMCYCLE.mock_429_rate)
        rate_500 = opts.number("rate_500", settings.LOOMCYCLE.mock_500_rate)
        roll = self._rng.random()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if roll < rate_429:
            raise ProviderError(self.id, 429, f"rate_limited (injected at {now})", retry_after=0.1)
        if roll < rate_429 + rate_500:
            raise ProviderError(self.id, 500, f"server_error (injected at {now})")

    def _latency(self, chars: int, opts: MockOptions) -> float:
        base = opts.number("latency_ms", settings.LOOMCYCLE.mock_latency_ms)
        jitter = opts.number("jitter_ms", settings.LOOMCYCLE.mock_latency_jitter_ms)
        seconds = (base + (self._rng.uniform(0, jitter) if jitter > 0 else 0.0)) / 1000.0
        return seconds + chars / 100 / 1_000_000

    def _script(
        self, variant: str, opts: MockOptions, request: ProviderRequest, step: int
    ) -> tuple[str, list[ToolCall]]:
        if variant == "mock-tool-loop":
            calls = int(opts.number("calls", 1))
            tool = opts.get("tool") or (request.tools[0].name if request.tools else "")
            if tool and step < calls:
                return "", [ToolCall(new_mock_tool_id(), tool, _tool_input(tool, step, opts))]
            return "done", []
        if variant in CIRCUIT_SCRIPTS:
            return _circuit_step(variant, request, step)
        if variant == "mock-mem-search":
            if step == 0:
                return "searching memory", [ToolCall(new_mock_tool_id(), "Memory", dict(MEM_SEARCH_INPUT))]
            return "done", []
        return "ok", []


def _tool_input(tool: str, step: int, opts: MockOptions) -> dict[str, Any]:
    if "input" in opts.raw:
        try:
            scripted = json.loads(opts.raw["input"])
        except json.JSONDecodeError as exc:
            raise ProviderError("mock", 400, f"mock-tool-loop: input is not JSON: {exc}") from exc
        if not isinstance(scripted, dict):
            raise ProviderError("mock", 400, "mock-tool-loop: input must be a JSON object")
        return scripted
    if tool == "Context":
        return {"op": "self"}
    if tool == "Agent":
        return {"op": "spawn", "name": opts.get("child", "echo"), "prompt": f"sub-task {step}"}
    return {"call": step}


def _compact_json(value: Any) -> str:
    """The tool input as Go's json.Marshal writes a map: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- circuit roles (loomcycle internal/providers/mock/driver.go) -------------

MEM_SEARCH_QUERY = "research summary"
MEM_SEARCH_INPUT: dict[str, Any] = {
    "dedup": {"enabled": True, "mode": "drop", "threshold": 0.9},
    "op": "search",
    "query": MEM_SEARCH_QUERY,
    "scope": "user",
    "top_k": 10,
}
SUBSCRIBE_WAIT_MS = 120_000
_CIRCUIT_ID = re.compile(r"\bc\d+\b", re.ASCII)
_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def derive_score(seed: str) -> float:
    """0.50 + bucket/100 with the float artifacts Go's float64 math leaves
    (bucket 7 -> 0.5700000000000001); 0.85 only for an empty seed."""
    if not seed:
        return 0.85
    return 0.50 + (fnv1a32(seed.encode()) % 50) / 100.0


def circuit_id(request: ProviderRequest) -> str:
    """The first `cN` word in the user messages' text blocks, in order; `c0`."""
    for message in request.messages:
        if message["role"] != "user":
            continue
        for block in message["content"]:
            if block.get("type") == "text":
                found = _CIRCUIT_ID.search(str(block.get("text", "")))
                if found:
                    return found.group(0)
    return "c0"


def _result_text(content: Any) -> str:
    """tool_result content: a string (our transcript) or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _nonempty(value: Any) -> str:
    return value if isinstance(value, str) and value else ""


def _as_object(value: Any) -> dict[str, Any] | None:
    """An object, or a JSON-encoded string holding one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def scan_json_for_key(text: str, key: str) -> str:
    """A non-empty string `key` in a tool result: top level, then each of
    `messages[]` (the message itself, then its `value`, object or JSON
    string), then a raw `"key": "..."` regex over the text; "" if none."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        if found := _nonempty(doc.get(key)):
            return found
        messages = doc.get("messages")
        for msg in messages if isinstance(messages, list) else []:
            if not isinstance(msg, dict):
                continue
            if found := _nonempty(msg.get(key)):
                return found
            value = _as_object(msg.get("value"))
            if value is not None and (found := _nonempty(value.get(key))):
                return found
    raw = re.search(r'"' + re.escape(key) + r'"\s*:\s*"([^"]+)"', text)
    return raw.group(1) if raw else ""


def newest_result_value(request: ProviderRequest, key: str) -> str:
    """`scan_json_for_key` over the user tool_result blocks, newest first."""
    for message in reversed(request.messages):
        if message["role"] != "user":
            continue
        for block in reversed(message["content"]):
            if block.get("type") == "tool_result":
                if found := scan_json_for_key(_result_text(block.get("content")), key):
                    return found
    return ""


def _memory_set(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "op": "set", "scope": "user", "value": value}


def _memory_get(key: str) -> dict[str, Any]:
    return {"key": key, "op": "get", "scope": "user"}


def _subscribe(channel: str) -> dict[str, Any]:
    return {"channel": channel, "max_messages": 1, "op": "subscribe", "wait_ms": SUBSCRIBE_WAIT_MS}


def _publish(channel: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"channel": channel, "op": "publish", "value": value}


def _researcher(cid: str, request: ProviderRequest) -> list[tuple[str, str, dict[str, Any]]]:
    text = f"Mock research for {cid}: a brief factual answer."
    return [
        ("storing research", "Memory", _memory_set(f"{cid}-research", {"text": text})),
        ("publishing done signal", "Channel", _publish(f"research-done/{cid}", {"circuit_id": cid})),
    ]


def _editor(cid: str, request: ProviderRequest) -> list[tuple[str, str, dict[str, Any]]]:
    run_id = newest_result_value(request, "run_id") or f"mock-editor-{cid}"
    edited = {"text": f"Mock edit {cid}: tightened."}
    done = {"circuit_id": cid, "editor_run_id": run_id}
    return [
        ("subscribing to research-done", "Channel", _subscribe(f"research-done/{cid}")),
        ("reading research", "Memory", _memory_get(f"{cid}-research")),
        ("storing edited version", "Memory", _memory_set(f"{cid}-research-edited", edited)),
        ("fetching self identity", "Context", {"op": "self"}),
        ("publishing editing-done", "Channel", _publish(f"editing-done/{cid}", done)),
    ]


def _evaluator(cid: str, request: ProviderRequest) -> list[tuple[str, str, dict[str, Any]]]:
    editor_run_id = newest_result_value(request, "editor_run_id")
    score = derive_score(editor_run_id + cid)
    submit = {"op": "submit", "rationale": "ok", "run_id": editor_run_id, "score": score}
    return [
        ("subscribing to editing-done", "Channel", _subscribe(f"editing-done/{cid}")),
        ("reading research", "Memory", _memory_get(f"{cid}-research")),
        ("reading edited version", "Memory", _memory_get(f"{cid}-research-edited")),
        ("storing score", "Memory", _memory_set(f"{cid}-research-scored", {"rationale": "ok", "score": score})),
        ("submitting evaluation", "Evaluation", submit),
    ]


# Each role's script: (narration, tool, input) per step. Built whole per call
# (cheap) so a step's input can depend on earlier tool results.
CIRCUIT_SCRIPTS = {
    "mock-researcher": _researcher,
    "mock-editor": _editor,
    "mock-evaluator": _evaluator,
}


def _circuit_step(variant: str, request: ProviderRequest, step: int) -> tuple[str, list[ToolCall]]:
    script = CIRCUIT_SCRIPTS[variant](circuit_id(request), request)
    if step >= len(script):
        return "done", []
    text, tool, tool_input = script[step]
    return text, [ToolCall(new_mock_tool_id(), tool, tool_input)]
