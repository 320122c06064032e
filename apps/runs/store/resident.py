"""The resident-children table's writes (part of apps/runs/store/, the one package
that writes the runs app's tables): the row inserted with its child run in the
parent's step commit, the locks every reader-writer takes (parent run row first,
then the resident row: one order everywhere, so no deadlock), the waiting call
set and cleared, the read cursor, and the one move out of `open`
(apps.runs.children.resident says who calls each, and in which order).
"""

from __future__ import annotations

from datetime import datetime

from apps.runs.models import ResidentChild, Run


def resident_insert(row: ResidentChild) -> None:
    """Insert an unsaved row, in the parent's step commit that inserted its child run. The
    child's report is the resident machinery's, never the one-shot sub-agent report
    (apps.runs.children.spawn), which would answer the open call a second time: the child is
    marked reported."""
    row.save(force_insert=True)
    Run.objects.filter(id=row.child_id).update(reported_to_parent=True)


def resident_lock(*, child_id: str, parent_id: str, skip_locked: bool = False) -> ResidentChild | None:
    """Inside a transaction: lock the parent run row, then the child's resident row (the
    order every writer keeps); None when the row is not there, or is not `parent_id`'s
    (or, with `skip_locked`, when another process holds either lock)."""
    parent = Run.objects.select_for_update(skip_locked=skip_locked).filter(id=parent_id).values_list("id", flat=True)
    if parent.first() is None:
        return None
    rows = ResidentChild.objects.select_for_update(skip_locked=skip_locked).filter(child_id=child_id)
    return rows.filter(parent_id=parent_id).first()


def resident_waiter_set(*, child_id: str, call_id: str, until: datetime | None, now: datetime) -> bool:
    """Under `resident_lock`: the parent's call `call_id` waits for this child's turn to end.
    Conditional on no call waiting already (one waiter per child, never overwritten); False
    when one does."""
    moved = ResidentChild.objects.filter(child_id=child_id, waiter_call_id="").update(
        waiter_call_id=call_id, waiter_until=until, last_used_at=now
    )
    return bool(moved)


def resident_waiter_clear(*, child_id: str, call_id: str, read_idx: int, now: datetime) -> bool:
    """Under `resident_lock`: the waiting call is answered, the output up to `read_idx` read.
    Conditional on the call still waiting: it is answered exactly once."""
    cleared = ResidentChild.objects.filter(child_id=child_id, waiter_call_id=call_id).update(
        waiter_call_id="", waiter_until=None, read_idx=read_idx, last_used_at=now
    )
    return bool(cleared)


def resident_read(*, child_id: str, read_idx: int) -> None:
    """Under `resident_lock`: the parent has read the child's output up to `read_idx` (a poll)."""
    ResidentChild.objects.filter(child_id=child_id, read_idx__lt=read_idx).update(read_idx=read_idx)


def resident_touch(*, child_id: str, now: datetime) -> None:
    """The child's turn ended: its idle time starts now."""
    ResidentChild.objects.filter(child_id=child_id, is_open=True).update(last_used_at=now)


def resident_close(*, child_id: str, reason: str, now: datetime) -> bool:
    """Take an open row to closed; False when it was closed already. Conditional: a row
    leaves `open` exactly once, whoever races for it (the first reason stays)."""
    moved = ResidentChild.objects.filter(child_id=child_id, is_open=True).update(
        is_open=False, close_reason=reason[:256], closed_at=now
    )
    return bool(moved)
