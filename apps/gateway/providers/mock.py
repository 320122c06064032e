"""The mock provider (SPEC 7.5): scripted, variable latency, 429/5xx injection.

Knobs come from LOOMCYCLE_MOCK_* (read once). Per call: roll the injected
failures, wait base + jitter + request_chars/100 us (cancel-aware), then play
the script picked by the model name at step = number of tool_result blocks
in the conversation.

The model string may carry options as a query string, e.g.
`mock-tool-loop?tool=Context&calls=2&latency_ms=2000`:
- `latency_ms`, `jitter_ms` override the process-wide latency for this model;
- `rate_429`, `rate_500` override the injected failure rates for this model;
- `mock-tool-loop`: calls `tool` (default: the first offered tool) `calls`
  times (default 1), then answers "done" (for `tool=Agent`, `child` names the
  agent it spawns, default `echo`; `input` is the tool input as URL-encoded
  JSON, for any tool);
- `mock-generic` and anything unknown: text "ok", end_turn;
- `mock-crash` (only with LOOMCYCLE_MOCK_ALLOW_CRASH=1): SIGKILLs its own
  process mid-call, to test crash recovery.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs

from apps.core.ids import new_mock_tool_id
from apps.gateway.providers.base import (
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
from loomcycle_project import env as E


def _parse_model(model: str) -> tuple[str, dict[str, str]]:
    base, _, query = model.partition("?")
    return base, {k: v[-1] for k, v in parse_qs(query).items()}


def _request_chars(request: ProviderRequest) -> int:
    return sum(len(s) for s in request.system) + len(json.dumps(request.messages))


def _tool_results(request: ProviderRequest) -> int:
    return sum(
        1 for m in request.messages if m["role"] == "user" for b in m["content"] if b.get("type") == "tool_result"
    )


class MockProvider(Provider):
    capabilities = Capabilities(streaming=False, parallel_tools=False, vision=True)

    def __init__(self, provider_id: str, *, stable: bool = False) -> None:
        self.id = provider_id
        self.stable = stable
        self._rng = random.Random()

    def stream(self, request: ProviderRequest, cancel: threading.Event) -> Iterator[ProviderEvent]:
        variant, opts = _parse_model(request.model)
        chars = _request_chars(request)
        self._roll_failures(opts)
        seconds = self._latency(chars, opts)
        if seconds > 0 and cancel.wait(seconds):
            raise ProviderCancelled()
        if cancel.is_set():
            raise ProviderCancelled()
        if variant == "mock-crash" and E.MOCK_ALLOW_CRASH:
            os.kill(os.getpid(), signal.SIGKILL)
        yield from self._play(variant, opts, request, chars)

    async def astream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        variant, opts = _parse_model(request.model)
        chars = _request_chars(request)
        self._roll_failures(opts)
        seconds = self._latency(chars, opts)
        if seconds > 0:
            await asyncio.sleep(seconds)
        for event in self._play(variant, opts, request, chars):
            yield event

    def _play(
        self, variant: str, opts: dict[str, str], request: ProviderRequest, chars: int
    ) -> Iterator[ProviderEvent]:
        step = _tool_results(request)
        text, calls = self._script(variant, opts, request, step)
        if text:
            yield TextDelta(text)
        yield from calls
        out_tokens = len(text) // 4 + sum(len(json.dumps(c.input)) // 4 for c in calls)
        usage = Usage(
            input_tokens=max(1, chars // 4),
            output_tokens=out_tokens,
            model=request.model,
            provider=self.id,
        )
        yield Done(stop_reason="tool_use" if calls else "end_turn", usage=usage)

    def _roll_failures(self, opts: dict[str, str]) -> None:
        if self.stable:
            return
        rate_429 = float(opts.get("rate_429", E.MOCK_429_RATE))
        rate_500 = float(opts.get("rate_500", E.MOCK_500_RATE))
        roll = self._rng.random()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if roll < rate_429:
            raise ProviderError(self.id, 429, f"rate_limited (injected at {now})", retry_after=0.1)
        if roll < rate_429 + rate_500:
            raise ProviderError(self.id, 500, f"server_error (injected at {now})")

    def _latency(self, chars: int, opts: dict[str, str]) -> float:
        base = float(opts.get("latency_ms", E.MOCK_LATENCY_MS))
        jitter = float(opts.get("jitter_ms", E.MOCK_LATENCY_JITTER_MS))
        seconds = (base + (self._rng.uniform(0, jitter) if jitter > 0 else 0.0)) / 1000.0
        return seconds + chars / 100 / 1_000_000

    def _script(
        self, variant: str, opts: dict[str, str], request: ProviderRequest, step: int
    ) -> tuple[str, list[ToolCall]]:
        if variant == "mock-tool-loop":
            calls = int(opts.get("calls", "1"))
            tool = opts.get("tool") or (request.tools[0].name if request.tools else "")
            if tool and step < calls:
                return "", [ToolCall(new_mock_tool_id(), tool, _tool_input(tool, step, opts))]
            return "done", []
        return "ok", []


def _tool_input(tool: str, step: int, opts: dict[str, str]) -> dict[str, Any]:
    if "input" in opts:
        try:
            scripted = json.loads(opts["input"])
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
