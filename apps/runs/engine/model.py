"""The iteration's model call: the run's candidates in order, retries with back-off, fallbacks, the
stream read into text and tool calls, and the usage it costs."""

from __future__ import annotations

import random
import threading
import time
from contextlib import nullcontext
from typing import Any

from django.conf import settings

from apps.core import toolregistry as registry
from apps.gateway import fairness
from apps.gateway.pricing import cost_usd
from apps.gateway.providers import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    get_provider,
    has_provider,
)
from apps.gateway.resolver import Candidate, Policy
from apps.runs import livetokens, tracing
from apps.runs.engine import metrics
from apps.runs.engine.admission import ADMISSION
from apps.runs.engine.turncancel import TurnCut
from apps.runs.engine.write import StepWrite
from apps.runs.store import ClaimedRun, Switched

REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def call_model(
    run: ClaimedRun, messages: list[dict[str, Any]], cancel: threading.Event, write: StepWrite
) -> tuple[str, list[ToolCall], Done]:
    """The provider call of this iteration, in its span (retries and fallbacks are its events)."""
    offered = registry.resolve(run.tools, tenant_id=run.tenant_id)
    tools = [ToolSpec(t.name, t.description, t.input_schema) for t in offered]
    with (
        tracing.provider_call(run, messages=len(messages), tools=len(tools)) as span,
        livetokens.calling(run.id, run.step, run.credentials) as live,
    ):
        text, calls, done = _call_candidates(run, messages, tools, cancel, write)
        tracing.provider_reply(span, done, calls)
        tracing.first_token(span, live.first_token_s)
        return text, calls, done


def _call_candidates(
    run: ClaimedRun, messages: list[dict[str, Any]], tools: list[ToolSpec], cancel: threading.Event, write: StepWrite
) -> tuple[str, list[ToolCall], Done]:
    """Call the run's current candidate; a retryable failure first uses the
    same-provider retries, then (policy permitting) falls back to the next
    candidate (SPEC 7.4). The switch is committed with the step."""
    routing = run.routing or {}
    candidates = [Candidate(**c) for c in routing.get("candidates") or []] or [Candidate(run.provider, run.model)]
    policy = Policy(**routing.get("policy") or {})
    idx = min(run.candidate_idx, len(candidates) - 1)
    fallbacks = run.fallbacks
    while True:
        cand = candidates[idx]
        request = ProviderRequest(
            model=cand.model,
            system=list(run.system),
            messages=messages,
            tools=tools,
            max_tokens=run.max_tokens,
            sampling=dict(routing.get("sampling") or {}),
            effort=str(routing.get("effort") or ""),
            run_id=run.id,
        )
        try:
            result = call_with_retries(cand.provider, request, cancel, write, policy.retry_attempts)
        except ProviderError as exc:
            nxt = _fallback_target(run, exc, idx, len(candidates), fallbacks, policy, write)
            if nxt is None:
                raise
            livetokens.abandoned("provider_fallback")
            messages = _switch(run, write, candidates[idx], candidates[nxt], exc, fallbacks + 1, messages)
            idx, fallbacks = nxt, fallbacks + 1
            write.switched = Switched(candidates[idx].provider, candidates[idx].model, idx, fallbacks)
            continue
        return result


def _fallback_target(
    run: ClaimedRun, exc: ProviderError, idx: int, count: int, fallbacks: int, policy: Policy, write: StepWrite
) -> int | None:
    """The candidate to switch to after `exc`, or None to fail the run."""
    if not exc.retryable or not policy.fallback_on_error or idx + 1 >= count:
        return None
    if fallbacks >= policy.max_fallback_attempts:
        write.events.append(
            {"type": "fallback_suppressed", "text": f"max_fallback_attempts ({policy.max_fallback_attempts}) reached"}
        )
        return None
    if settings.LOOMCYCLE.fallback_pin_after_success and run.step > 0:
        write.events.append(
            {
                "type": "fallback_suppressed",
                "text": f"pinned to {run.provider}/{run.model} after a successful turn "
                "(LOOMCYCLE_FALLBACK_PIN_AFTER_SUCCESS)",
            }
        )
        return None
    return idx + 1


def _switch(
    run: ClaimedRun,
    write: StepWrite,
    failed: Candidate,
    new: Candidate,
    exc: ProviderError,
    attempt: int,
    messages: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Record the switch; the history the new provider sees drops the old one's reasoning."""
    tracing.provider_event(
        "provider.fallback",
        {
            "loomcycle.failed_provider": failed.provider,
            "loomcycle.failed_model": failed.model,
            "loomcycle.new_provider": new.provider,
            "loomcycle.new_model": new.model,
            "loomcycle.provider_status": exc.status,
            "loomcycle.attempt": attempt,
        },
    )
    write.events.append(
        {
            "type": "provider_fallback",
            "fallback": {
                "failed_provider": failed.provider,
                "failed_model": failed.model,
                "new_provider": new.provider,
                "new_model": new.model,
                "attempt": attempt,
                "user_tier": (run.routing or {}).get("user_tier", ""),
                "reason": "rate_limited" if exc.status == 429 else "provider_error",
                "cause_error": str(exc),
            },
        }
    )
    cached = has_provider(failed.provider) and get_provider(failed.provider).capabilities.native_prompt_cache
    if failed.provider != new.provider and cached:
        write.events.append({"type": "cache_invalidated", "text": f"prompt cache on {failed.provider} left behind"})
    stripped = strip_reasoning(messages)
    if stripped is not messages:
        write.events.append(
            {"type": "reasoning_invalidated", "text": f"reasoning from {failed.provider} removed from the history"}
        )
    return stripped


def strip_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without thinking blocks (the same list when there are none)."""
    if not any(b.get("type") in REASONING_BLOCKS for m in messages for b in m["content"]):
        return messages
    out = []
    for m in messages:
        content = [b for b in m["content"] if b.get("type") not in REASONING_BLOCKS]
        if content:
            out.append({**m, "content": content})
    return out


def call_with_retries(
    provider_id: str, request: ProviderRequest, cancel: threading.Event, write: StepWrite, retries: int
) -> tuple[str, list[ToolCall], Done]:
    if not has_provider(provider_id):  # configured where the run was created, not on this worker
        raise ProviderError(provider_id, 503, "provider is not configured on this worker (check its key/yaml)")
    provider = get_provider(provider_id)
    for attempt in range(1, retries + 2):
        t0 = time.perf_counter()
        result = "error"
        try:
            try:
                # a remote call gives the engine to other iterations; provider_slot: its max_concurrent
                with ADMISSION.outside() if provider.capabilities.remote else nullcontext():
                    with fairness.provider_slot(provider.id, cancel=cancel):
                        reply = _consume(provider.stream(request, cancel))
                        result = "ok"
                        return reply
            except fairness.SlotRefused as refused:  # queued too long: retry/fall back like a provider 429
                raise ProviderError(provider.id, 429, refused.message, retry_after=5.0) from refused
        except ProviderError as exc:
            if not exc.retryable or attempt > retries:
                raise
            wait_s = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
            wait_s = min(wait_s, 30.0) + random.uniform(0, 0.1)
            write.events.append({"type": "retry", "retry": _retry_info(provider.id, attempt, wait_s, exc)})
            livetokens.abandoned("retry")
            tracing.provider_event(
                "provider.retry",
                {
                    "loomcycle.provider": provider.id,
                    "loomcycle.attempt": attempt,
                    "loomcycle.wait_ms": int(wait_s * 1000),
                    "loomcycle.provider_status": exc.status,
                },
            )
            with ADMISSION.outside():
                if cancel.wait(wait_s):
                    raise ProviderCancelled() from exc
        except ProviderCancelled:
            result = "cancelled"
            raise
        finally:
            seconds = time.perf_counter() - t0
            write.provider_s += seconds
            labels = (provider.id, request.model)
            write.metrics.inc(metrics.PROVIDER_CALLS, (*labels, result))
            write.metrics.observe(metrics.PROVIDER_SECONDS, labels, seconds)
    raise AssertionError("unreachable: the loop returns or raises")


def _retry_info(provider_id: str, attempt: int, wait_s: float, exc: ProviderError) -> dict[str, Any]:
    return {
        "provider": provider_id,
        "attempt": attempt,
        "wait_ms": int(wait_s * 1000),
        "reason": "retry-after header" if exc.retry_after is not None else "exponential backoff",
        "error": str(exc),
    }


def _consume(stream: Any) -> tuple[str, list[ToolCall], Done]:
    """Collect one model turn. Reasoning arrives as ThinkingDelta (shown as a
    `thinking` event) and, for replay, as Done.thinking blocks."""
    text: list[str] = []
    calls: list[ToolCall] = []
    done: Done | None = None
    live = livetokens.tap()  # the deltas go live to Redis (apps.runs.livetokens), never to Postgres
    try:
        for event in stream:
            if isinstance(event, TextDelta):
                text.append(event.text)
                live.delta("text", event.text)
            elif isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Done):
                done = event
            elif isinstance(event, ThinkingDelta):
                live.delta("thinking", event.text)  # the whole reasoning is in done.thinking / the thinking event
    except ProviderCancelled as exc:  # what was streamed so far, for a turn-cancel (apps.runs.engine.turncancel)
        raise TurnCut("".join(text), calls) from exc
    if done is None:
        raise ProviderError("engine", 502, "provider stream ended without a done event")
    return "".join(text), calls, done


def record_reply(run: ClaimedRun, write: StepWrite, text: str, calls: list[ToolCall], done: Done) -> None:
    content: list[dict[str, Any]] = [dict(b) for b in done.thinking]  # replayed first, as Anthropic requires
    reasoning = "".join(str(b.get("thinking", "")) for b in done.thinking)
    if reasoning:
        write.events.append({"type": "thinking", "text": reasoning})
    if text:
        content.append({"type": "text", "text": text})
        write.events.append({"type": "text", "text": text})
    for call in calls:
        block = {"id": call.id, "name": call.name, "input": call.input}
        content.append({"type": "tool_use", **block})
        write.events.append({"type": "tool_call", "tool_use": block})
    if content:
        write.transcript.append(("assistant", content))
    write.events.append({"type": "usage", "usage": done.usage.as_dict()})
    record_usage(run, write, done)


def record_usage(run: ClaimedRun, write: StepWrite, done: Done) -> None:
    """One provider call's ledger row, and the run's usage totals with it."""
    usage = done.usage.as_dict()
    cost = cost_usd(done.usage.provider, done.usage.model, done.usage)
    write.ledger.append(
        {
            "provider": done.usage.provider,
            "model": done.usage.model,
            "input_tokens": done.usage.input_tokens,
            "output_tokens": done.usage.output_tokens,
            "cache_creation_input_tokens": done.usage.cache_creation_input_tokens,
            "cache_read_input_tokens": done.usage.cache_read_input_tokens,
            "cost_usd": None if cost is None else str(cost),
        }
    )
    write.usage = _add_usage(write.usage or run.usage or {}, usage)  # a compaction's call, then the turn's


def _add_usage(total: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    out = dict(total)
    for key, value in usage.items():
        out[key] = out.get(key, 0) + value if isinstance(value, int) else value
    return out
