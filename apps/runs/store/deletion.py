"""Deleting whole run trees: the one place rows of runs and their child tables are removed.

A tree is a run and every run below it (`parent_id`, the FK index serves the walk). Only a
tree whose every run is terminal is deleted: the rows are locked `FOR UPDATE` and their
status re-read in the deleting transaction, so a run that is still live (or becomes so)
keeps the whole tree. Events, transcript, inputs, tool calls, interrupts, resident rows and
anything else declared `on_delete=CASCADE` to Run (a channel wait, a completion-webhook
delivery) go with the run through Django's collector, which deletes them per table with
`run_id IN (...)` (each has an index led by run_id). Fan-out rows are found through their
slots' `run_id` (unique) and their parent (`fanout_parent`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from django.db import connection

from apps.runs.fanout_models import FanOut, FanOutSlot
from apps.runs.models import TERMINAL, Run
from apps.runs.statuses import NO_TRACE

_TREE_SQL = """
WITH RECURSIVE tree(id) AS (
    SELECT id FROM runs_run WHERE id = ANY(%s)
    UNION
    SELECT r.id FROM runs_run r JOIN tree t ON r.parent_id = t.id
)
SELECT id FROM tree
"""


def tree_ids(*, root_ids: Sequence[str]) -> list[str]:
    """The ids of the runs at and below `root_ids` (the roots included when they exist)."""
    if not root_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_TREE_SQL, [list(root_ids)])
        return [row[0] for row in cursor.fetchall()]


def live_in(*, run_ids: Sequence[str], lock: bool) -> list[str]:
    """The runs among `run_ids` that are not terminal; `lock` takes their rows `FOR UPDATE`
    first (the caller's transaction), so none can change status until it commits."""
    qs = Run.objects.filter(id__in=list(run_ids))
    if lock:
        # Locks every row of the tree: a wake or a cancel of one of them waits for this delete.
        qs = qs.select_for_update()
    rows = list(qs.values_list("id", "status"))
    return [run_id for run_id, status in rows if status not in TERMINAL]


def _fanouts_delete(run_ids: list[str]) -> int:
    via_slots = FanOutSlot.objects.filter(run_id__in=run_ids).values_list("fanout_id", flat=True)
    via_parent = FanOut.objects.filter(parent_run_id__in=run_ids).values_list("id", flat=True)
    ids = {*via_slots, *via_parent}
    # A runs:batch join holds slots of several top-level runs: only this tree's slots go, and
    # the join row when no slot of a child is left.
    FanOutSlot.objects.filter(run_id__in=run_ids).delete()
    empty = FanOut.objects.filter(id__in=ids).exclude(slots__run_id__isnull=False)
    deleted, _ = empty.delete()
    return deleted


def runs_delete(*, run_ids: Sequence[str]) -> dict[str, int]:
    """Delete these runs and every row that cascades from them, in the caller's transaction;
    rows removed per table (`runs.RunEvent`, ...). The caller checked they are terminal."""
    ids = list(run_ids)
    counts: Counter[str] = Counter()
    counts["runs.FanOut"] += _fanouts_delete(ids)
    _, per_model = Run.objects.filter(id__in=ids).delete()
    counts.update(per_model)
    return {name: n for name, n in counts.items() if n}


def mark_no_trace(*, run_id: str) -> None:
    """`?cancel=true` on a live tree: its end deletes it (notify_finished brings the end to
    apps.lifecycle's listener; beat's retention sweep is the backstop)."""
    Run.objects.filter(id=run_id).update(retention=NO_TRACE, notify_finished=True)


def retention_clear(*, run_id: str) -> None:
    """A no-trace run kept under an override: from now on the tenant's retention age applies."""
    Run.objects.filter(id=run_id).update(retention="")
