"""A worker killed with doorbells it had taken but not started (queued in
admission before their claim, so no lease covers them): their runs resume
within lease + sweep (workers/held.py), not after the sweeper's grace. With
LOOMCYCLE_FAST_TRANSPORT=0 (kombu's stock transport, no held hash) they
resume through the sweeper's grace instead: later, but every run completes.

The doorbells are held in admission deterministically: the test holds every
run's row lock, so each worker's two admission slots (LOOMCYCLE_ENGINE_
ADMISSION_SLOTS) are taken by claims waiting for that lock and the other
doorbells it took wait in admission."""

from __future__ import annotations

import time

import pytest
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from apps.core.redis import sync_client
from apps.runs.models import Run, RunStatus
from tests.conftest import fast_transport, wait_for
from tests.factories.runs import start
from tests.procs import WorkerPool
from tests.runs.locks import run_updates_waiting
from workers.queues import RUNS

pytestmark = pytest.mark.usefixtures("agents")

RUNS_COUNT = 20


def _claims_waiting() -> int:
    return run_updates_waiting("c")


def _consumers(action: str, stack: WorkerPool) -> None:
    getattr(current_app.control, action)(RUNS, reply=True, timeout=5, limit=len(stack.pids()))


def test_doorbells_a_killed_worker_held_in_admission_are_rung_again_within_lease_and_sweep(stack: WorkerPool) -> None:
    lease, sweep = settings.LOOMCYCLE.lease_seconds, settings.LOOMCYCLE.sweep_seconds
    grace = settings.LOOMCYCLE.requeue_grace_seconds
    assert lease + 2 * sweep + 3 < grace  # else the grace path alone could pass this test
    wait_for(lambda: len(current_app.control.ping(timeout=1)) == len(stack.pids()), timeout=60)  # all consuming
    _consumers("cancel_consumer", stack)
    try:
        ids = [start("echo").id for _ in range(RUNS_COUNT)]
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(id__in=ids).values_list("id", flat=True))
            _consumers("add_consumer", stack)
            # Two claims per worker wait for the lock; every other doorbell is taken and waits in admission.
            wait_for(lambda: _claims_waiting() == 2 * len(stack.pids()) and sync_client().llen(RUNS) == 0)
            Run.objects.filter(id__in=ids).update(updated_at=Now())  # the grace counts from here
            stack.kill(stack.pids()[0])
            killed_at = time.monotonic()
    finally:
        _consumers("add_consumer", stack)  # a no-op where it is consuming already
    # Inside lease + sweep (+ one presence refresh and the iteration itself); the grace is longer.
    # Kombu's stock transport keeps its copies until the visibility timeout: the grace re-rings them.
    fast = fast_transport()
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status=RunStatus.COMPLETED).count() == RUNS_COUNT,
        timeout=(lease if fast else grace) + 2 * sweep + 3,
        interval=0.1,
    )
    if fast:
        assert time.monotonic() - killed_at < grace
