"""The runs app's spans: one trace per run (docs/architecture.md, "Tracing").

A run's root span (`run.create`) is started around its insert; its W3C
`traceparent` is stored on the run row (`Run.trace_context`, written by
apps.runs.store with the row). Every iteration span (`run.iterate`), on
whichever worker and however long after, is a child of that stored context,
and links to the Celery span of the delivery that ran it. Provider calls
(`chat <model>`) and tool calls (`tool <name>`) are children of their
iteration; a wake (`run.wake`) is a child of the run's root that links to
whatever woke it. A sub-agent's root span is created inside its parent's
iteration, so sub-agents are children in their parent's trace.

Invariants:
- No prompt, transcript, tool input or tool output text in any span: ids,
  sizes, token counts, model, provider, tool names, statuses only.
- With no tracer provider installed (loomcycle_project.telemetry found no
  exporter), every helper here returns at once: no span objects, no context
  attached, nothing serialised. Whether one is installed is decided once per
  process, at the first call (`enabled`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AnyValue

from apps.core import genai as g

if TYPE_CHECKING:
    from apps.core.tools import ToolContext, ToolResult
    from apps.gateway.providers import Done, ToolCall
    from apps.runs.models import Run
    from apps.runs.store import ClaimedRun

_TRACER = trace.get_tracer("loomcycle.runs")
_W3C = TraceContextTextMapPropagator()
_OFF: AbstractContextManager[None] = nullcontext()  # what every span helper returns with tracing off


_installed: bool | None = None


def enabled() -> bool:
    """A tracer provider is installed (ours, or a host project's), as the process's first
    call here found it: providers are installed at process start (loomcycle_project.telemetry,
    or a host project's settings), before any run is created or iterated. Cached, because
    the API's lookup reads os.environ on every call while none is set (~1 us each)."""
    global _installed
    if _installed is None:
        _installed = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _installed


def traceparent(span: Span) -> str:
    """The span's W3C `traceparent`; '' for a span that is not sampled in (invalid)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def _parent(stored: str) -> otel_context.Context | None:
    """The context a stored `traceparent` names; None (the current one) when there is none."""
    return _W3C.extract({"traceparent": stored}) if stored else None


def _link_to_current() -> list[Link]:
    current = trace.get_current_span().get_span_context()
    return [Link(current)] if current.is_valid else []


def current() -> otel_context.Context | None:
    """This thread's context, to hand to worker threads (None when tracing is off)."""
    return otel_context.get_current() if enabled() else None


def run_created(run: Run) -> AbstractContextManager[Any]:
    """The run's root span around its insert; stores its context on `run.trace_context`."""
    return _run_created(run) if enabled() else _OFF


@contextmanager
def _run_created(run: Run) -> Iterator[None]:
    attributes: dict[str, AnyValue] = {
        "loomcycle.run_id": run.id,
        "loomcycle.tenant_id": run.tenant_id,
        "loomcycle.agent": run.agent_name,
        "loomcycle.parent_run_id": run.parent_id or "",
        "loomcycle.depth": run.depth,
        g.OPERATION: "invoke_agent",
        **_agent(run.agent_name, run.agent_id, run.session_id),
    }
    with _TRACER.start_as_current_span("run.create", attributes=attributes) as span:
        run.trace_context = traceparent(span)
        yield


def _agent(name: str, agent_id: str, session_id: str) -> dict[str, AnyValue]:
    """GenAI's agent attributes: the agent (its definition's name), this run's handle, and its
    session as the conversation (every run of a session shares its transcript)."""
    return {g.AGENT_NAME: name, g.AGENT_ID: agent_id, g.CONVERSATION_ID: session_id}


def iteration_start(run: ClaimedRun, worker_id: str) -> Span | None:
    """An iteration's span (not yet current: `active`): a child of the run's stored
    root, linked to the span of the delivery that runs it (Celery's, when instrumented)."""
    if not enabled():
        return None
    attributes: dict[str, AnyValue] = {
        "loomcycle.run_id": run.id,
        "loomcycle.tenant_id": run.tenant_id,
        "loomcycle.agent": run.agent_name,
        "loomcycle.step": run.step,
        "loomcycle.attempt": run.attempts,
        "loomcycle.worker_id": worker_id,
        "loomcycle.transcript_rows": len(run.transcript),
        **_agent(run.agent_name, run.agent_id, run.session_id),
    }
    return _TRACER.start_span(
        "run.iterate", context=_parent(run.trace_context), links=_link_to_current(), attributes=attributes
    )


def active(span: Span | None, *, end: bool = False) -> AbstractContextManager[Any]:
    """`span` is the current span inside; it is ended on leaving when `end`, and on an
    exception, which is recorded by its type only (its text may quote a prompt)."""
    return _OFF if span is None else _active(span, end)


@contextmanager
def _active(span: Span, end: bool) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        end = True
        raise
    finally:
        otel_context.detach(token)
        if end:
            span.end()


def iteration_done(span: Span | None, *, outcome: str, status: str | None, events: int) -> None:
    """Where the iteration left the run; a park is also a span event."""
    if span is None:
        return
    span.set_attribute("loomcycle.outcome", outcome)
    span.set_attribute("loomcycle.events", events)
    if status is not None:
        span.set_attribute("loomcycle.status", status)
    if outcome == "park" and status is not None:
        span.add_event("run.parked", {"loomcycle.status": status})


def provider_call(run: ClaimedRun, *, messages: int, tools: int) -> AbstractContextManager[Span | None]:
    """The iteration's provider call, retries and fallbacks included (as events).
    Errors are recorded by type and status only: a provider's error text may quote the prompt."""
    return _provider_call(run, messages, tools) if enabled() else _OFF


@contextmanager
def _provider_call(run: ClaimedRun, messages: int, tools: int) -> Iterator[Span]:
    attributes: dict[str, AnyValue] = {
        **g.call_attributes("chat", run.provider, run.model),
        **_agent(run.agent_name, run.agent_id, run.session_id),
        "loomcycle.run_id": run.id,
        "loomcycle.request.messages": messages,
        "loomcycle.request.tools": tools,
    }
    with _TRACER.start_as_current_span(
        f"chat {run.model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        started, error = time.perf_counter(), ""
        try:
            yield span
        except BaseException as exc:
            error = type(exc).__name__
            span.set_attribute("error.type", error)
            if (status := getattr(exc, "status", None)) is not None:
                span.set_attribute("loomcycle.provider_status", status)
            span.set_status(Status(StatusCode.ERROR, error))
            raise
        finally:  # the call's duration; its tokens are recorded by provider_reply
            g.record_call(
                g.call_attributes("chat", run.provider, run.model),
                seconds=time.perf_counter() - started,
                error=error,
            )


def provider_reply(span: Span | None, done: Done, calls: list[ToolCall]) -> None:
    if span is None:
        return
    usage = done.usage
    span.set_attribute(g.PROVIDER, usage.provider)  # the candidate that answered (a fallback's)
    span.set_attribute(g.RESPONSE_MODEL, usage.model)
    span.set_attribute(g.INPUT_TOKENS, usage.input_tokens)
    span.set_attribute(g.OUTPUT_TOKENS, usage.output_tokens)
    span.set_attribute(g.FINISH_REASONS, [done.stop_reason or "end_turn"])
    span.set_attribute("loomcycle.tool_calls", len(calls))
    request_model = str((getattr(span, "attributes", None) or {}).get(g.REQUEST_MODEL, ""))
    g.record_tokens(g.call_attributes("chat", usage.provider, request_model, usage.model), usage)


def first_token(span: Span | None, seconds: float | None) -> None:
    """Time to first token of the call (seconds from the start of the first attempt that streamed
    one to its first text or thinking delta), named after the GenAI semantic conventions'
    `gen_ai.server.time_to_first_token`."""
    if span is not None and seconds is not None:
        span.set_attribute("gen_ai.server.time_to_first_token", seconds)


def provider_event(name: str, attributes: dict[str, Any]) -> None:
    """A retry or a fallback, on the current (provider) span; no error text."""
    if enabled():
        trace.get_current_span().add_event(name, attributes)


def tool_call(
    ctx: ToolContext, call: ToolCall, parent: otel_context.Context | None
) -> AbstractContextManager[Span | None]:
    """One tool call, under `parent` (the iteration's context: calls may run on pool threads)."""
    return _OFF if parent is None else _tool_call(ctx, call, parent)


@contextmanager
def _tool_call(ctx: ToolContext, call: ToolCall, parent: otel_context.Context) -> Iterator[Span]:
    attributes: dict[str, AnyValue] = {
        g.OPERATION: "execute_tool",
        g.TOOL_NAME: call.name,
        g.TOOL_CALL_ID: call.id,
        g.TOOL_TYPE: "function",
        "loomcycle.run_id": ctx.run_id,
        "loomcycle.step": ctx.step,
        "loomcycle.tool.input_bytes": len(json.dumps(call.input, default=str)),
    }
    with _TRACER.start_as_current_span(f"execute_tool {call.name}", context=parent, attributes=attributes) as span:
        yield span


def tool_result(span: Span | None, result: ToolResult) -> None:
    if span is None:
        return
    span.set_attribute("loomcycle.tool.is_error", result.is_error)
    span.set_attribute("loomcycle.tool.output_chars", len(result.text))
    span.set_attribute("loomcycle.tool.parked", result.park is not None)
    span.set_attribute("loomcycle.tool.spawned", result.spawn is not None)
    if result.is_error:
        span.set_status(Status(StatusCode.ERROR, "tool returned an error"))


def woken(stored: str, *, run_id: str, reason: str, ring: Callable[[], None]) -> None:
    """Ring a woken run's doorbell inside a `run.wake` span of the run's trace (linked to
    the waker's span), so the delivery that follows is in the run's trace too."""
    if not enabled() or not stored:
        ring()
        return
    attributes = {"loomcycle.run_id": run_id, "loomcycle.wake.reason": reason}
    with _TRACER.start_as_current_span(
        "run.wake", context=_parent(stored), links=_link_to_current(), attributes=attributes
    ):
        ring()
