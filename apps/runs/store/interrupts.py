"""The interrupts table's writes (part of apps/runs/store/, the one package
that writes the runs app's tables): the row an Interruption.ask parks on,
inserted in the parked step's commit; its row lock; and its one way out of
`pending` (apps.runs.interrupts.services says who calls each, and in which order).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.core.redact import Redactor, runtime_redactor
from apps.runs.credentials import run_redactor_of
from apps.runs.models import Interrupt, InterruptStatus, Run


def interrupt_insert(interrupt: Interrupt) -> None:
    """Insert an unsaved row; inside the parked step's commit, so it exists iff the run parked on it."""
    interrupt.save(force_insert=True)


def interrupt_lock(*, interrupt_id: str, run_id: str | None = None, skip_locked: bool = False) -> Interrupt | None:
    """Inside a transaction: the row, locked (every resolver and the expiry sweep take this
    lock before the run's, so they serialise without deadlock); None when it is not there
    (or, with `skip_locked`, when another process holds it)."""
    rows = Interrupt.objects.select_for_update(skip_locked=skip_locked).filter(id=interrupt_id)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    return rows.first()


def interrupt_finish(
    *,
    interrupt_id: str,
    status: InterruptStatus,
    answer: Any = None,
    note: str = "",
    resolved_by: str = "",
    at: datetime | None = None,
) -> datetime | None:
    """Take a pending row to `status` at `at` (default now); its resolved_at, or None when it had
    already left `pending`. The answer and the note are stored redacted with the run's redactor
    (its credentials and the runtime's secrets), as the question was and as the transcript's copy is."""
    now = at or timezone.now()
    if answer is not None or note:
        redactor = _redactor_of(interrupt_id)
        answer, note = redactor.value(answer), redactor.text(note)
    # Conditional: a row leaves `pending` exactly once, whoever races for it.
    moved = Interrupt.objects.filter(id=interrupt_id, status=InterruptStatus.PENDING).update(
        status=status, answer=answer, note=note, resolved_by=resolved_by, resolved_at=now
    )
    return now if moved else None


def _redactor_of(interrupt_id: str) -> Redactor:
    found = Run.objects.filter(interrupts__id=interrupt_id).values_list("id", "credentials_sealed").first()
    if found is None:  # no run (it cannot answer anyway): the runtime's secrets still apply
        return runtime_redactor()
    return run_redactor_of(run_id=found[0], sealed=found[1])
