"""The fan-out join's writes (part of apps/runs/store/, the one package that
writes the runs app's tables): the join and its slots, inserted with the
children; a child's report counted under the join's row lock; a waiting
sibling started; the join closed. apps.runs.children.fanout says who calls each.

Lock order, the same for every report: the FanOut row first (every report
of one join queues there), then the child's run row (the report's
compare-and-set), then a waiting sibling's run row, then the parent's. No
other transaction takes a FanOut row's lock, and a cancel holds one run row
at a time, so a report never waits in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F
from django.utils import timezone

from apps.runs.fanout_models import FanOut, FanOutSlot, SlotState
from apps.runs.models import TERMINAL, Run, RunStatus


def fanout_insert(fanout: FanOut, slots: list[FanOutSlot]) -> None:
    """Insert an unsaved join and its slots; inside the transaction that inserts the children."""
    fanout.save(force_insert=True)
    FanOutSlot.objects.bulk_create(slots)


def fanout_child_claim(*, child_id: str) -> bool:
    """Compare-and-set: True for the first report of a terminal child only
    (the flag `reported_to_parent` means "reported to its join" for a batch child)."""
    claimed = Run.objects.filter(id=child_id, reported_to_parent=False, status__in=TERMINAL).update(
        reported_to_parent=True
    )
    return bool(claimed)


@dataclass(frozen=True)
class Counted:
    """A report counted: the join (locked, as updated), whether this report completed it, and
    whether the child's slot was `started` (it held one of the join's concurrent places: only
    then may its report start a waiting sibling; a child cancelled while `waiting` held none)."""

    fanout: FanOut
    completed: bool
    was_started: bool


def fanout_lock(*, fanout_id: str) -> FanOut:
    """Inside a transaction: the join, locked. Taken first by every report of the join."""
    # The FanOut row lock serialises every report of one join: `reported` and the slot move together.
    return FanOut.objects.select_for_update().get(id=fanout_id)


def fanout_count(*, fanout: FanOut, run_id: str) -> Counted | None:
    """Inside a transaction holding `fanout`'s lock (fanout_lock): mark the
    child's slot reported and count it. None when the slot was already
    reported (nothing written). The slot's state is read and moved under the join's lock, which
    every writer of this join's slots holds."""
    fanout_id = fanout.id
    before = (
        FanOutSlot.objects.filter(fanout_id=fanout_id, run_id=run_id)
        .exclude(state=SlotState.REPORTED)
        .values_list("id", "state")
        .first()
    )
    if before is None:
        return None
    slot_id, state = before
    if not FanOutSlot.objects.filter(id=slot_id, state=state).update(state=SlotState.REPORTED):
        return None
    FanOut.objects.filter(id=fanout_id).update(reported=F("reported") + 1)
    fanout.reported += 1
    completed = fanout.reported >= fanout.size
    if completed:
        fanout.completed_at = timezone.now()
        FanOut.objects.filter(id=fanout_id).update(completed_at=fanout.completed_at)
    return Counted(fanout=fanout, completed=completed, was_started=state == SlotState.STARTED)


def fanout_start_next(*, fanout_id: str) -> str | None:
    """Inside a transaction holding the FanOut row lock: start the lowest-index
    waiting child (its run `waiting_fanout` -> `queued`, its slot `started`).
    The started run's id, for a doorbell after commit; None when none waits.
    A waiting child cancelled meanwhile is skipped and its slot left `waiting`: its own report
    counts it, and starts no sibling (it never held a place)."""
    waiting = FanOutSlot.objects.filter(fanout_id=fanout_id, state=SlotState.WAITING).order_by("index")
    for slot_id, run_id in waiting.values_list("id", "run_id"):
        # Conditional: a cancel that finished the waiting child first wins.
        if Run.objects.filter(id=run_id, status=RunStatus.WAITING_FANOUT).update(
            status=RunStatus.QUEUED, updated_at=timezone.now()
        ):
            FanOutSlot.objects.filter(id=slot_id).update(state=SlotState.STARTED)
            return str(run_id)
    return None
