"""Restoring runs from a snapshot (apps.runs.snapshot): the run rows and
their events, transcript, inputs, tool-call records and interrupts, insert-or-ignore.

A run is restored whole or not at all: its child rows are inserted only when
its own row was written, so a second restore of the same snapshot writes
nothing (RunInput rows have no natural key that would make them a no-op on
their own). Runs are inserted parents first (the caller orders them by depth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Model
from django.utils import timezone

from apps.core.errors import Conflict
from apps.core.rows import rows_insert_or_ignore
from apps.runs.models import Interrupt, Run, RunEvent, RunInput, RunStatus, ToolCallRecord, TranscriptEntry

CHILD_TABLES: dict[str, type[RunEvent | TranscriptEntry | RunInput | ToolCallRecord | Interrupt]] = {
    "events": RunEvent,
    "transcript": TranscriptEntry,
    "inputs": RunInput,
    "tool_calls": ToolCallRecord,
    "interrupts": Interrupt,  # a run parked `awaiting_interrupt` keeps its question (and its `intr_` id)
}


@dataclass(frozen=True)
class RunRowsWritten:
    """Rows one run's restore wrote (all zero when the run was already here)."""

    run: int
    events: int = 0
    transcript: int = 0
    inputs: int = 0
    tool_calls: int = 0
    interrupts: int = 0


def run_restore(*, run: dict[str, Any], children: dict[str, list[dict[str, Any]]]) -> RunRowsWritten:
    """Inside the restore's transaction: the run row, then (only if it was written) its children.
    A run whose id is here already is skipped; one that clashes with another run here (the same
    agent_id in its tenant under another id) is a 409 `snapshot_conflict`, never silently dropped."""
    try:
        with transaction.atomic():  # a savepoint: the clash is reported, the caller's transaction decides
            written = rows_insert_or_ignore(Run, [run], conflict_on="id")
    except IntegrityError as exc:
        raise Conflict(
            f"run {run['id']} clashes with a run here (agent_id {run.get('agent_id')!r} "
            f"of tenant {run.get('tenant_id', '')!r} is taken)",
            code="snapshot_conflict",
            details={
                "run_id": run["id"],
                "agent_id": run.get("agent_id"),
                "tenant_id": run.get("tenant_id", ""),
                "reason": str(exc).splitlines()[0],
            },
        ) from exc
    if not written:
        return RunRowsWritten(run=0)
    counts = {
        key: rows_insert_or_ignore(model, [_tied(model, row, run) for row in children.get(key, [])])
        for key, model in CHILD_TABLES.items()
    }
    return RunRowsWritten(run=1, **counts)


_OWNER_FIELDS = ("tenant_id", "user_id", "agent_id", "agent_name")


def _tied(model: type[Model], row: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A child row belongs to its run: its run id and, where the table carries them, its
    tenant, user, agent id and agent name are the run's (never what the snapshot row says)."""
    names = {f.attname for f in model._meta.concrete_fields}
    owner = {key: run.get(key, "") for key in _OWNER_FIELDS if key in names}
    return {**row, **owner, "run_id": run["id"]}


def runs_resume_restored(run_ids: list[str]) -> list[tuple[str, int]]:
    """Inside a transaction: the restored runs still `paused` back to running; their (id, step) doorbells."""
    # Conditional flip: only runs still paused (a concurrent pause or cancel may have moved them).
    rows = list(
        Run.objects.select_for_update().filter(id__in=run_ids, status=RunStatus.PAUSED).values_list("id", "step")
    )
    Run.objects.filter(id__in=[r for r, _ in rows]).update(status=RunStatus.RUNNING, updated_at=timezone.now())
    return rows
