"""Compaction requests (part of apps/runs/store/, the one package that writes
the runs app's tables): a manual or self request is a RunInput row of its own
`source` (apps.runs.compaction.plan.SOURCES), drained by the engine's next
iteration like steering input; a run has at most one pending at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.runs.models import Run, RunInput
from apps.runs.statuses import TERMINAL, RunStatus


@dataclass(frozen=True)
class CompactQueued:
    terminal: bool  # the run had ended: nothing written
    duplicate: bool  # a request was already pending: nothing written
    woke: bool  # this request flipped an `awaiting_input` run back to running
    step: int


def compact_request_queue(*, run_id: str, source: str, params: str, sources: Sequence[str]) -> CompactQueued:
    """Queue a compaction request unless the run ended or one of `sources` is pending;
    exactly one caller wakes a run parked at `awaiting_input`. One transaction."""
    with transaction.atomic():
        # Row lock: the terminal check, the one-pending check and the counter move together.
        locked = Run.objects.select_for_update().only("status", "step").get(id=run_id)
        if locked.status in TERMINAL:
            return CompactQueued(True, False, False, locked.step)
        pending = RunInput.objects.filter(run_id=run_id, consumed_step__isnull=True, source__in=list(sources))
        if pending.exists():
            return CompactQueued(False, True, False, locked.step)
        RunInput.objects.create(run_id=run_id, text=params, source=source)
        Run.objects.filter(id=run_id).update(pending_inputs=F("pending_inputs") + 1)
        # Conditional wake: exactly one caller flips awaiting_input -> running.
        woke = Run.objects.filter(id=run_id, status=RunStatus.AWAITING_INPUT).update(
            status=RunStatus.RUNNING, updated_at=timezone.now()
        )
    return CompactQueued(False, False, bool(woke), locked.step)
