"""Completion webhooks (issue 38): a run's `webhook` is POSTed, signed, when the run ends (or parks
awaiting input or an interrupt, if it asks), durably and at least once.

Invariants:
- The delivery row is written in the transaction that commits the event (`record_in_commit`: the
  engine's final step commit, a cancel's commit), so it exists iff the event does; a beat backstop
  (`webhooks_sweep`) records the end of any webhook run that ended on a path that did not.
- After the commit a doorbell task (`deliver_task` by name: the wing imports no face) makes the
  first attempt at once; a lost doorbell is covered by the sweep, which re-rings every due row.
- An attempt claims its row by compare-and-set with a lease (store.claim), makes one POST outside
  any transaction, and settles it; a failure is due again after an exponential backoff with
  jitter, until LOOMCYCLE_RUN_WEBHOOK_MAX_ATTEMPTS, then `failed`. No thread ever sleeps for a
  retry: the wait is the row's `next_attempt_at`, answered by beat.
- A worker killed mid-attempt leaves the row pending with its lease; the sweep re-sends it after
  the lease, with the same `webhook-id`: the receiver dedupes on it (at least once).
"""

from __future__ import annotations

import logging

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, transaction
from kombu.exceptions import KombuError

from apps.runs.completion import send
from apps.runs.store import webhooks as store

log = logging.getLogger("loomcycle.runs.webhooks")

DELIVER_TASK = "maintenance.run_webhook_deliver"
SWEEP_BATCH = 500
LEASE_GRACE_S = 30.0  # past one attempt's timeout: a lease this old is a dead attempt


def record_in_commit(*, run_id: str, event: str) -> None:
    """Inside the transaction committing the run's `event`: its delivery row (if the run's webhook
    asks for it) and, after the commit, the doorbell of its first attempt."""
    delivery_id = store.record(run_id=run_id, event=event)
    if delivery_id is not None:
        transaction.on_commit(lambda: ring(delivery_id))


def ring(delivery_id: str) -> None:
    """Enqueue an attempt; a broker failure is logged (the sweep rings the row again)."""
    try:
        current_app.send_task(DELIVER_TASK, kwargs={"delivery_id": delivery_id})
    except (KombuError, OSError):
        log.exception("webhook delivery %s: doorbell lost; the sweep will ring it", delivery_id)


def lease_s() -> float:
    return settings.LOOMCYCLE.run_webhook_timeout_ms / 1000.0 + LEASE_GRACE_S


def webhook_deliver(*, delivery_id: str) -> str | None:
    """One attempt of `delivery_id` if it is due and this call claims it; the row's new state."""
    claimed = store.claim(delivery_id=delivery_id, lease_s=lease_s())
    if claimed is None:
        return None
    outcome = send.attempt(claimed)
    state = store.settle(
        claimed=claimed,
        status=outcome.status,
        error=outcome.error,
        max_attempts=settings.LOOMCYCLE.run_webhook_max_attempts,
    )
    if outcome.error:
        log.warning(
            "webhook delivery %s (run %s) attempt %s: %s", claimed.id, claimed.run_id, claimed.attempts, outcome.error
        )
    return state


def webhooks_sweep() -> int:
    """Beat: record the ends no end path recorded, then ring every due delivery (first attempts whose
    doorbell was lost, retries whose backoff is over, attempts whose worker died). Rows rung."""
    for run_id, status in store.ended_unrecorded(limit=SWEEP_BATCH):
        try:
            with transaction.atomic():
                record_in_commit(run_id=run_id, event=status)
        except DatabaseError:
            log.exception("webhook sweep: recording the end of run %s failed; the next sweep retries", run_id)
    due = store.due(limit=SWEEP_BATCH)
    for delivery_id in due:
        ring(delivery_id)
    return len(due)
