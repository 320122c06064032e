"""Thin Celery adapters over the run services. Tasks take ids, never transcripts."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from apps.runs import engine, services, signals, wake
from apps.runs.children import report, resident
from apps.runs.completion import services as completion
from apps.runs.interrupts import services as interrupts
from apps.runs.sessions import promotion
from workers import transport
from workers.base import AgentTask
from workers.queues import ITERATE_TASK

log = logging.getLogger("loomcycle.runs")


@shared_task(base=AgentTask, name=ITERATE_TASK)
def run_iterate_task(run_id: str, step: int, token: int | None = None, **_: Any) -> str:
    """One agent-loop iteration; duplicates and stale steps are no-ops. `token`: the
    lease its step commit armed, adopted instead of claimed (apps.runs.engine.adopt)."""
    return engine.run_iterate(run_id=run_id, step=step, token=token)


@shared_task(base=AgentTask, name="maintenance.run_leases_sweep")
def run_leases_sweep_task(**_: Any) -> int:
    """Requeue runs whose lease expired or whose doorbell was lost, and the
    doorbells dead workers held; finish parked runs whose cancel had not landed;
    cancel live runs whose parent has ended (a cascade that did not reach them);
    start runs enqueued behind a session that no run's end started;
    settle a pause once every run has parked; re-send lifecycle signals whose
    outbox row outlived the grace (apps.runs.signals.resend_due).
    Each sweep runs even if another failed (a Redis error must not stop the
    Postgres sweeps); the first failure is raised once all have run."""
    total, failure = 0, None
    for sweep in (
        transport.recover,
        services.run_leases_sweep,
        services.run_parked_cancels_finish,
        services.run_orphans_cancel,
        promotion.sessions_promote_sweep,
        _pause_settle,
        signals.resend_due,
    ):
        try:
            total += sweep()
        except Exception as exc:
            log.exception("lease sweep: %s failed", sweep.__name__)
            failure = failure or exc
    if failure is not None:
        raise failure
    return total


def _pause_settle() -> int:
    """A pause whose request went away settles here once every run has parked."""
    services.runtime_pause_settle()
    return 0


@shared_task(base=AgentTask, name="maintenance.children_report_sweep")
def children_report_sweep_task(**_: Any) -> int:
    """Report finished child runs whose report to their parent was lost."""
    return report.children_report_sweep()


@shared_task(base=AgentTask, name="maintenance.run_slots_reconcile")
def run_slots_reconcile_task(**_: Any) -> int:
    """Free fairness slots of runs that finished without releasing them."""
    return services.run_slots_reconcile()


@shared_task(base=AgentTask, name="maintenance.runs_admission_sweep")
def runs_admission_sweep_task(**_: Any) -> int:
    """Start runs waiting for an admission slot that no finishing run promoted."""
    return wake.runs_admit_waiting()


@shared_task(base=AgentTask, name="maintenance.interrupts_expire")
def interrupts_expire_task(**_: Any) -> int:
    """Time out interruptions past their deadline (each wakes its run once), and cancel
    pending ones whose run ended."""
    return interrupts.interrupts_expire_due()


@shared_task(base=AgentTask, name="maintenance.resident_sweep")
def resident_sweep_task(**_: Any) -> int:
    """Close resident children idle past their TTL, or whose parent or own run ended, and
    answer parent calls whose child's turn is over or whose wait timed out."""
    return resident.resident_sweep()


@shared_task(base=AgentTask, name=completion.DELIVER_TASK)
def run_webhook_deliver_task(delivery_id: str, **_: Any) -> str | None:
    """One attempt of a completion webhook delivery (a duplicate or an early doorbell is a no-op)."""
    return completion.webhook_deliver(delivery_id=delivery_id)


@shared_task(base=AgentTask, name="maintenance.run_webhooks_sweep")
def run_webhooks_sweep_task(**_: Any) -> int:
    """Record webhook runs' ends no end path recorded; ring every due delivery (retries, lost doorbells)."""
    return completion.webhooks_sweep()
