"""Giving back a new run's fairness slot when the transaction that created it rolls back.

`run_create` takes the run's Redis slot before it inserts the row (so an over-cap
create is refused with 429 at once, inside the caller's transaction too). When the
caller's transaction, or a savepoint around the create, rolls back, the row is gone
but Redis is not transactional: the slot would stay taken until the reconcile sweep.

Django has `on_commit` but no rollback hook; the project's database backend
(`loomcycle_project.db`) adds `on_rollback`, which runs a callback when the
transaction, or a savepoint active at registration, rolls back, at the moment Django
rolls it back, and forgets it when the transaction commits. So the slot is free when
the caller's `atomic` block has exited.

Under another backend (a deployment that names Django's own in DATABASES), there is
no hook: the slot of a rolled-back create is freed by `run_slots_reconcile` within a
sweep, as it is for a process that dies with its transaction open. The release runs
inside Django's rollback path: a Redis error is logged, and the sweep frees the slot.
"""

from __future__ import annotations

import logging

from django.db import transaction

from apps.gateway import fairness

log = logging.getLogger("loomcycle.runs")


def release_slot_unless_committed(run_id: str) -> None:
    """Release `run_id`'s fairness slot if the current transaction does not commit.
    Outside a transaction the insert already committed: nothing to watch."""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        return
    on_rollback = getattr(connection, "on_rollback", None)
    if on_rollback is None:
        log.debug("run %s: no on_rollback in this database backend; a rollback leaves the slot to the sweep", run_id)
        return
    on_rollback(lambda: _release(run_id))


def _release(run_id: str) -> None:
    try:
        fairness.run_slot_release(run_id)
    except Exception:  # inside Django's rollback: never raise; reconcile frees it within a sweep
        log.exception("run %s: creation rolled back; releasing its fairness slot failed", run_id)
