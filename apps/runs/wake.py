"""Answering a parked tool call, and waking the run: the one service through
which sub-agents and channels resume a parked run (`run_answer`).

Invariants:
- Called inside the answerer's transaction, so the answer (transcript row,
  events, the finished tool-call record) and whatever produced it (a child's
  report flag, a channel cursor, the deleted wait row) commit together.
- The run row is locked first: answers to one run are serialised, so
  transcript indexes and event seqs stay consecutive.
- Exactly the answer that brings `pending_calls` to zero flips the run from
  its parked status back to `running` (a conditional UPDATE) and rings its
  doorbell after the commit. A run that ended meanwhile (cancelled) is left
  alone and the answer is dropped.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.runs.dispatch import enqueue_iteration, notify_events
from apps.runs.models import TERMINAL, Run, RunEvent, RunStatus, ToolCallRecord, ToolCallStatus, TranscriptEntry

ANSWERABLE = (RunStatus.WAITING_CHILDREN, RunStatus.WAITING_CHANNEL)


def run_answer(
    *,
    run_id: str,
    call_id: str,
    tool_name: str,
    text: str,
    is_error: bool,
    events: tuple[dict[str, Any], ...] = (),
) -> bool:
    """Append the result of parked call `call_id` (plus `events` before it) and
    wake the run if it was the last pending call. Must run inside a
    transaction. False when the run is already terminal (nothing written)."""
    run = Run.objects.select_for_update().get(id=run_id)
    if run.status in TERMINAL:
        return False
    record = ToolCallRecord.objects.filter(run_id=run_id, call_id=call_id).order_by("-step").first()
    step = record.step if record else max(run.step - 1, 0)
    tool_use = {"id": call_id, "name": tool_name, "input": record.input if record else {}}
    payloads = [*events, {"type": "tool_result", "tool_use": tool_use, "text": text, "is_error": is_error}]
    RunEvent.objects.bulk_create(
        [
            RunEvent(run_id=run_id, seq=run.last_seq + i, step=step, type=p["type"], payload=p)
            for i, p in enumerate(payloads, start=1)
        ]
    )
    seq = run.last_seq + len(payloads)
    TranscriptEntry.objects.create(
        run_id=run_id,
        idx=run.transcript_len,
        step=step,
        role="user",
        content=[{"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}],
    )
    if record:
        ToolCallRecord.objects.filter(id=record.id).update(
            status=ToolCallStatus.FINISHED, is_error=is_error, finished_at=timezone.now()
        )
    Run.objects.filter(id=run_id).update(
        last_seq=seq,
        transcript_len=F("transcript_len") + 1,
        pending_calls=F("pending_calls") - 1,
        updated_at=timezone.now(),
    )
    transaction.on_commit(lambda: notify_events(run_id, seq))
    # Conditional wake: exactly the last answer flips the run back to running.
    if Run.objects.filter(id=run_id, status__in=ANSWERABLE, pending_calls=0).update(
        status=RunStatus.RUNNING, updated_at=timezone.now()
    ):
        transaction.on_commit(lambda: enqueue_iteration(run_id, run.step))
    return True
