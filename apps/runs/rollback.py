"""Giving back a new run's fairness slot when the transaction that created it rolls back.

`run_create` takes the run's Redis slot before it inserts the row (so an over-cap
create is refused with 429 at once, inside the caller's transaction too). When the
caller's transaction, or a savepoint around the create, rolls back, the row is gone
but Redis is not transactional: the slot stayed taken until the reconcile sweep.

Django has no rollback hook, but it documents that a rolled-back transaction's
`on_commit` callbacks are discarded, never called: on a rollback of the outermost
transaction it empties the connection's callback list, on a savepoint rollback it
drops the callbacks registered inside that savepoint. So the create registers a
small callable with `on_commit` and watches it with `weakref.finalize`: dropped
after being called (commit) it does nothing; dropped uncalled (rollback, or the
connection closed with the transaction open) it releases the slot. CPython frees
the callable the moment Django drops it (reference counting; nothing else refers
to it), so the slot is free when the caller's `atomic` block has exited.

Dropped uncalled is not proof of a rollback: when an `on_commit` callback registered
before the marker raises, Django drops the remaining callbacks of a transaction that
did commit. So before releasing, the finalizer asks a fresh connection (it sees only
committed rows, and never touches the caller's connection, which may be mid-rollback)
whether the run row exists; present, the run committed and keeps its slot.

What this gives up: the release runs inside Django's rollback path, so it must not
raise (a Redis or Postgres error is logged, and `run_slots_reconcile` frees the slot within a
sweep, as it does for a process that dies with its transaction open).
"""

from __future__ import annotations

import logging
import weakref

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from apps.gateway import fairness
from apps.runs.models import Run

log = logging.getLogger("loomcycle.runs")


class _Committed:
    """The on_commit callback: only marks that the commit happened."""

    def __init__(self) -> None:
        self.state = {"committed": False}  # shared with the finalizer, which must not refer to self

    def __call__(self) -> None:
        self.state["committed"] = True


def release_slot_unless_committed(run_id: str) -> None:
    """Release `run_id`'s fairness slot if the current transaction does not commit.
    Outside a transaction the insert already committed: nothing to watch."""
    if not transaction.get_connection().in_atomic_block:
        return
    marker = _Committed()
    weakref.finalize(marker, _release_if_rolled_back, run_id, marker.state)
    transaction.on_commit(marker)


def _release_if_rolled_back(run_id: str, state: dict[str, bool]) -> None:
    if state["committed"]:
        return
    try:
        if _committed_row_exists(run_id):  # an earlier on_commit callback raised: committed all the same
            return
        fairness.run_slot_release(run_id)
    except Exception:  # inside Django's rollback: never raise; reconcile frees it within a sweep
        log.exception("run %s: creation not committed; releasing its fairness slot failed", run_id)


def _committed_row_exists(run_id: str) -> bool:
    """Whether `run_id`'s row is committed, asked on a connection of its own (closed after)."""
    fresh = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with fresh.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s", [run_id])
            return cursor.fetchone() is not None
    finally:
        fresh.close()
