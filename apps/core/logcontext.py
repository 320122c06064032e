"""What a log record is about: the run, its tenant and the step an engine iteration
sets around its work (`bound`, `update`), and the current OpenTelemetry trace id.

With LOOMCYCLE_LOG_FORMAT=json the console handler carries `RunContextFilter`,
which copies them onto every record as `run_id`, `tenant`, `step` and `trace_id`
(each only when known), so the JSON formatter writes them as fields. With the
plain format nothing reads them: the engine's cost is one ContextVar set and
reset per iteration.

Invariants: a context is a fresh dict per `bound` block, reset when the block
ends, so nothing leaks from one iteration into the next on a pool thread. Threads
an iteration starts see it only when started in a copy of the context
(`contextvars.copy_context().run`, as apps.runs.engine.toolrun does for tool calls).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

FIELDS = ("run_id", "tenant", "step")

_CURRENT: ContextVar[dict[str, Any] | None] = ContextVar("loomcycle_log_context", default=None)


class bound:  # lower-case: used like a function, `with bound(run_id=...)`
    """Log records made inside the block (in this context) carry `fields`. A class,
    not @contextmanager: it runs once per iteration, and a generator costs several
    times a ContextVar set and reset."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields  # a fresh dict per call: `update` may add to it

    def __enter__(self) -> None:
        self._token = _CURRENT.set(self._fields)

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)


def update(**fields: Any) -> None:
    """Add fields to the current block's context (the tenant, once the claim has read
    the run); nothing outside a `bound` block."""
    current = _CURRENT.get()
    if current is not None:
        current.update(fields)


def current() -> dict[str, Any]:
    """A copy of the current context's fields (empty outside a `bound` block)."""
    return dict(_CURRENT.get() or {})


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits), None when no span is recording."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class RunContextFilter(logging.Filter):
    """Adds the current context's fields and trace id to each record (never
    overwriting an attribute the record already has); drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _CURRENT.get() or {}
        for name, value in fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        if not hasattr(record, "trace_id") and (tid := trace_id()) is not None:
            record.trace_id = tid
        return True
