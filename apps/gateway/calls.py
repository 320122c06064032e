"""One gateway call, from admission to its audit row: routing, the fairness
slot, the provider call, the OpenTelemetry span and the outcome.

Invariants:
- the first routing candidate is the only one called: the gateway never
  falls back across providers (SPEC 7.4); retries are the driver's own;
- the provider's first event is awaited before any response byte, so a
  failure before the first token is a real HTTP status (502), not a 200
  whose body says it failed;
- every call ends in exactly one `finish`: the slot is released, the span
  ended and one audit row queued (apps.gateway.audit), whether the call
  succeeded, failed, or its client went away (status 499).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from apps.core import genai as g
from apps.core.errors import ApplicationError, Invalid
from apps.core.identity import acting_user_id, may_name_user
from apps.core.ids import is_ident
from apps.core.metrics import Batch
from apps.core.types import Principal
from apps.gateway import budget, fairness
from apps.gateway.audit import WRITER
from apps.gateway.convert import images_ready
from apps.gateway.operator_key import operator_key_check
from apps.gateway.pricing import cost_usd
from apps.gateway.providers import (
    Done,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
    get_provider,
)
from apps.gateway.resolver import Candidate, resolve
from apps.gateway.services import CallRecord
from apps.gateway.usage_metrics import count_usage

log = logging.getLogger("loomcycle.gateway")
_TRACER = trace.get_tracer("loomcycle.gateway")
_BACKGROUND: set[asyncio.Task[None]] = set()
CLIENT_CLOSED = 499


class ProviderCallFailed(ApplicationError):
    status, code = 502, "provider_call_failed"


def provider_failed(exc: ProviderError) -> ProviderCallFailed:
    """502 with the provider's own text; `x-should-retry` tells the OpenAI SDKs
    whether a retry can help (429/5xx/transport: yes; a 4xx: no)."""
    headers = {"x-should-retry": "true" if exc.retryable else "false"}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    details = {"provider": exc.provider, "provider_status": exc.status}
    return ProviderCallFailed(str(exc), details=details, headers=headers)


def outcome_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, ApplicationError):
        return exc.status, exc.code
    if isinstance(exc, ProviderError):
        return 502, ProviderCallFailed.code
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return CLIENT_CLOSED, "client_closed"
    return 500, "internal"


def _column(value: str, size: int) -> str:
    """Fit a caller-supplied string to its audit column (Postgres text refuses NUL)."""
    return value.replace("\x00", "")[:size]


# Ids name calls, they guard nothing: a PRNG seeded from the OS (getrandom per id
# costs ~0.1 ms in some VMs) is unique enough and keeps the syscall off the hot path.
_IDS = random.Random()


def random_hex(nbytes: int) -> str:
    return f"{_IDS.getrandbits(nbytes * 8):0{nbytes * 2}x}"


def new_request_id() -> str:
    return f"req_{random_hex(8)}"


class Call:
    """The bookkeeping of one call. `finish` is idempotent and never raises
    for the audit: it only queues the row."""

    def __init__(self, *, principal: Principal, endpoint: str, user_id: str, stream: bool, model: str = "") -> None:
        self.principal = principal
        self.endpoint = endpoint
        self.user_id = user_id
        self.stream = stream
        self.request_id = new_request_id()
        self.created_at = timezone.now()
        self.provider = ""
        self.model = model
        self.usage: Usage | None = None
        self.finished = False
        self.budget_held = False
        self._t0 = time.perf_counter()
        self.operation = "embeddings" if endpoint == "embeddings" else "chat"
        self._stack = AsyncExitStack()
        self._events: AsyncIterator[ProviderEvent] | None = None
        self.span = _TRACER.start_span(
            f"gateway {endpoint}",
            kind=SpanKind.CLIENT,
            attributes={
                g.OPERATION: self.operation,
                "loomcycle.endpoint": endpoint,
                "loomcycle.request_id": self.request_id,
                "loomcycle.tenant_id": principal.tenant_id,
                "loomcycle.user_id": user_id,
                "loomcycle.stream": stream,
            },
        )

    def describe(self, *, user_id: str, stream: bool, model: str) -> None:
        """What the parsed body says (the call is audited from before its body is read)."""
        self.user_id, self.stream, self.model = user_id, stream, model
        self.span.set_attribute("loomcycle.user_id", user_id)
        self.span.set_attribute("loomcycle.stream", stream)

    def routed(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model
        self.span.update_name(f"{self.operation} {model}")
        self.span.set_attribute(g.PROVIDER, provider)
        self.span.set_attribute(g.REQUEST_MODEL, model)

    async def hold(self, manager: AbstractAsyncContextManager[Any]) -> None:
        """Enter a context (a fairness slot) that lasts until `finish`."""
        await self._stack.enter_async_context(manager)

    async def admit(self, *, provider_gate: bool = True) -> None:
        """The provider's concurrency gate (waits up to the queue timeout), then
        the per-user/tenant slot (SPEC 9.6): a call queued on a full provider
        does not hold a user slot meanwhile. 429 when refused."""
        # The caller's budgets first (429 token_limit_exceeded): a refused call takes no slot.
        self.budget_held = await budget.hold(
            request_id=self.request_id, tenant_id=self.principal.tenant_id, user_id=self.user_id
        )
        if provider_gate:
            await self.hold(fairness.aprovider_slot(self.provider))
        await self.hold(fairness.acall_slot(self.principal.tenant_id, self.user_id))

    def start(self, events: AsyncIterator[ProviderEvent]) -> None:
        self._events = events

    async def next_event(self) -> ProviderEvent | None:
        """The provider's next event; None at its end; a ProviderError becomes a 502."""
        assert self._events is not None
        try:
            event = await anext(self._events)
        except StopAsyncIteration:
            return None
        except ProviderError as exc:
            raise provider_failed(exc) from exc
        if isinstance(event, Done):
            self.usage = event.usage
        return event

    async def fail(self, exc: BaseException) -> None:
        if isinstance(exc, ApplicationError):
            exc.headers.setdefault("X-Request-Id", self.request_id)
        status, code = outcome_of(exc)
        if status >= 500 and status != 502:
            log.error("gateway %s %s failed: %r", self.endpoint, self.request_id, exc)
        await self.finish(status, code)

    async def finish(self, status: int, error_code: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        try:
            if self._events is not None and hasattr(self._events, "aclose"):
                await self._events.aclose()  # the provider's HTTP stream, when it was not read to its end
            await self._stack.aclose()
            if self.budget_held:  # what the call spent joins its budgets (apps.gateway.budget)
                await budget.settle(request_id=self.request_id, usage=self.usage)
        finally:
            self._record(status, error_code)

    def _record_genai(self, usage: Usage | None, error_code: str) -> None:
        """The span's usage attributes and the GenAI client metrics (apps.core.genai); a call refused
        before it was routed to a provider made no GenAI operation, so it has no metric point."""
        if usage is not None:
            self.span.set_attribute(g.RESPONSE_MODEL, usage.model or self.model)
            self.span.set_attribute(g.INPUT_TOKENS, usage.input_tokens)
            self.span.set_attribute(g.OUTPUT_TOKENS, usage.output_tokens)
        if not self.provider:
            return
        attributes = g.call_attributes(self.operation, self.provider, self.model, usage.model if usage else "")
        g.record_call(attributes, seconds=time.perf_counter() - self._t0, error=error_code)
        if usage is not None:
            g.record_tokens(attributes, usage)

    def _record(self, status: int, error_code: str) -> None:
        latency_ms = int((time.perf_counter() - self._t0) * 1000)
        usage = self.usage
        span = self.span
        span.set_attribute("http.response.status_code", status)
        self._record_genai(usage, error_code)
        if error_code:
            span.set_attribute("error.type", error_code)
            span.set_status(Status(StatusCode.ERROR, error_code))
        span.end()
        if usage is not None and settings.LOOMCYCLE.metrics_enabled:
            self._count(usage)
        WRITER.record(
            CallRecord(
                request_id=self.request_id,
                tenant_id=_column(self.principal.tenant_id, 128),
                user_id=_column(self.user_id, 128),
                subject=_column(self.principal.subject, 128),
                endpoint=self.endpoint,
                provider=_column(self.provider, 64),
                model=_column(self.model, 256),
                stream=self.stream,
                status_code=status,
                error_code=error_code[:64],
                latency_ms=latency_ms,
                created_at=self.created_at,
                usage=usage,
            )
        )

    def _count(self, usage: Usage) -> None:
        """The call's spend counters (apps.gateway.usage_metrics), one Redis round trip."""
        batch = Batch()
        entry: dict[str, Any] = {**usage.as_dict(), "provider": usage.provider or self.provider}
        entry["model"] = usage.model or self.model
        entry["cost_usd"] = cost_usd(entry["provider"], entry["model"], usage)
        count_usage(batch, tenant_id=self.principal.tenant_id, entry=entry)
        batch.flush()

    def abandon_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """From a finalizer: finish as a client hang-up on the loop (thread-safe)."""
        if self.finished or loop.is_closed():
            return

        def schedule() -> None:
            task = loop.create_task(self.finish(CLIENT_CLOSED, "client_closed"))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

        loop.call_soon_threadsafe(schedule)


@dataclass(frozen=True)
class ChatSpec:
    """What the caller asked for: routing hints and the neutral request (its
    `model` is replaced by the routed one)."""

    provider: str | None
    model: str | None
    tier: str | None
    user_tier: str | None
    request: ProviderRequest


def _route(spec: ChatSpec) -> Candidate:
    """The first candidate (SPEC 7.4: no fallback). A provider this process does
    not have is SPEC 2.11's 400 `provider_unavailable`."""
    try:
        return resolve(provider=spec.provider, model=spec.model, tier=spec.tier, user_tier=spec.user_tier)[0]
    except Invalid as exc:
        if exc.code == "unknown_provider":
            exc.code = "provider_unavailable"
        raise


async def chat_open(call: Call, spec: ChatSpec) -> ProviderEvent:
    """Route, admit, start the provider call and return its first event.
    On any failure the call is finished (audited) and the error raised."""
    try:
        candidate = _route(spec)
        call.routed(candidate.provider, candidate.model)
        provider = get_provider(candidate.provider)
        operator_key_check(call.principal, provider, candidate.provider)  # 403 before any slot is taken
        request = await images_ready(spec.request, candidate.provider, candidate.model)  # 400s, then any fetch
        await call.admit()
        call.start(provider.astream(replace(request, model=candidate.model)))
        first = await call.next_event()
        if first is None:
            raise provider_failed(ProviderError(candidate.provider, 0, "the provider ended the reply without events"))
        return first
    except BaseException as exc:
        await call.fail(exc)
        raise


class Reply:
    """A whole reply, aggregated from a call's events (non-streamed responses)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.blocks: list[TextDelta | ToolCall] = []  # text runs and tool calls, in order
        self.done: Done | None = None

    def add(self, event: ProviderEvent) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
            if self.blocks and isinstance(self.blocks[-1], TextDelta):
                self.blocks[-1] = TextDelta(self.blocks[-1].text + event.text)
            else:
                self.blocks.append(event)
        elif isinstance(event, ThinkingDelta):
            self.thinking.append(event.text)
        elif isinstance(event, ToolCall):
            self.blocks.append(event)
        else:
            self.done = event

    @property
    def calls(self) -> list[ToolCall]:
        return [b for b in self.blocks if isinstance(b, ToolCall)]

    @property
    def stop_reason(self) -> str:
        return self.done.stop_reason if self.done else "end_turn"


async def chat_reply(call: Call, first: ProviderEvent) -> Reply:
    """Read the call to its end; the call is finished either way."""
    reply = Reply()
    try:
        reply.add(first)
        while (event := await call.next_event()) is not None:
            reply.add(event)
    except BaseException as exc:
        await call.fail(exc)
        raise
    await call.finish(200)
    return reply


def caller_user_id(principal: Principal, wire: str | None) -> str:
    """The user a call counts against: a tenant token's own subject unless it
    may name the user (apps.core.identity, SPEC 8)."""
    if may_name_user(principal) and wire and not is_ident(wire):
        raise Invalid("invalid user_id: must match [A-Za-z0-9_-]{1,128}", code="invalid_user_id")
    return acting_user_id(principal, wire)
