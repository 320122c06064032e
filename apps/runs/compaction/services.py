"""Compaction requests and settings (docs/compaction.md). Invariants:
- a request is a queued row (apps.runs.store.compact_request_queue), applied
  by the run's next iteration on a worker; no request thread waits for the
  summary. A run parked at `awaiting_input` is woken to apply it and parks
  again; any other parked run applies it when it next runs;
- a run has at most one request pending: asking again changes nothing;
- a run's settings are pinned at creation: its agent's `compaction` block,
  or, when the agent has none, its parent's (settings flow down the spawn tree).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from apps.core.errors import Conflict, Unprocessable
from apps.core.types import Principal
from apps.runs import signals, store, tracing
from apps.runs.compaction import plan as compacting
from apps.runs.dispatch import enqueue_iteration
from apps.runs.selectors import run_get, run_routing


def run_compact(
    *, principal: Principal, run_id: str, keep_last_n: int | None = None, keep_first: bool | None = None
) -> dict[str, Any]:
    """Queue a manual compaction of the caller's run (404 another tenant's or unknown,
    409 `run_terminal`, 422 `compaction_disabled`)."""
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    params = {k: v for k, v in (("keep_last_n", keep_last_n), ("keep_first", keep_first)) if v is not None}
    queued = _queue(run.id, compacting.SOURCE_MANUAL, params, run.routing, trace_context=run.trace_context)
    return {"run_id": run.id, "queued": True, "duplicate": queued.duplicate, "applied": False, "compacted": False}


def run_compact_self(*, run_id: str) -> dict[str, Any]:
    """The Context tool's `compact` op: the calling run asks to be compacted before its next model call."""
    queued = _queue(run_id, compacting.SOURCE_SELF, {}, run_routing(run_id=run_id), trace_context="")
    return {"requested": True, "duplicate": queued.duplicate, "applies": "before your next model call"}


def _queue(
    run_id: str, source: str, params: dict[str, Any], routing: dict[str, Any], *, trace_context: str
) -> store.CompactQueued:
    if not compacting.Settings.of(routing).enabled:
        raise Unprocessable("compaction is disabled for this run's agent", code="compaction_disabled")
    with transaction.atomic():
        queued = store.compact_request_queue(
            run_id=run_id, source=source, params=json.dumps(params) if params else "", sources=compacting.SOURCES
        )
        if queued.woke:
            step = queued.step
            transaction.on_commit(
                lambda: tracing.woken(
                    trace_context, run_id=run_id, reason="compact", ring=lambda: enqueue_iteration(run_id, step)
                )
            )
            signals.send_on_commit(signals.run_resumed, run_id=run_id)  # as a woken input's, with the wake
    if queued.terminal:
        raise Conflict(f"run {run_id} has already ended", code="run_terminal")
    return queued
