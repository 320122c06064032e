"""Trigger writes other than the firing itself (apps.triggers.schedules):
the schedules admin verbs (SPEC 2.6) and what happens when a trigger's run
ends.

Invariants:
- a principal acts only on its own tenant's schedules (admins on any); the
  state row of an active version is seeded on demand, as a tick would;
- run-now, pause and resume are single-row writes under the row lock, so
  they serialise with a tick firing the same schedule;
- a finished run's hooks run once (apps.triggers.oncomplete) and its fire
  row and state learn its terminal status; a second announcement changes
  nothing but those same values.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app
from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from apps.core.errors import Conflict
from apps.core.types import Principal
from apps.runs.selectors import run_statuses
from apps.runs.statuses import TERMINAL, RunStatus
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.substrate.selectors import active_defs
from apps.triggers import presenters, selectors
from apps.triggers.cron import cron_of, next_after
from apps.triggers.models import FireOutcome, JobState, OnCompleteJob, ScheduleFire, ScheduleState
from apps.triggers.oncomplete import oncomplete_run
from apps.triggers.schedules import new_state, schedule_version_activated

log = logging.getLogger("loomcycle.triggers")

PAUSED_FOREVER = datetime(9999, 1, 1, tzinfo=UTC)  # SPEC 2.6: pause sets paused_until far in the future


def _next(row: ScheduleDef, after: datetime) -> datetime | None:
    d = row.definition
    return next_after(cron_of(d), str(d.get("timezone") or "UTC"), after)


def _locked_state(principal: Principal, def_id: str) -> tuple[ScheduleDef, ScheduleState]:
    """The schedule's state row, locked (seeded first if needed); only an active version has one."""
    row = selectors.schedule_def_get(tenant_id=principal.read_tenant, def_id=def_id)
    if not active_defs(get_kind("schedule")).filter(id=row.id).exists():
        raise Conflict(
            f"schedule {def_id!r} is not the active version of {row.name!r} (or is retired)", code="schedule_not_active"
        )
    if not ScheduleState.objects.filter(schedule_def_id=row.id).exists():
        pointer = get_kind("schedule").pointer._default_manager.filter(active_def_id=row.id).first()
        activated = pointer.promoted_at if pointer is not None and pointer.promoted_at else row.created_at
        ScheduleState.objects.bulk_create([new_state(row, activated, timezone.now())], ignore_conflicts=True)
    return row, ScheduleState.objects.select_for_update().get(schedule_def_id=row.id)


@transaction.atomic
def schedule_run_now(*, principal: Principal, def_id: str) -> dict[str, Any]:
    """Due at once: the next tick fires it (a fire keyed by this moment); its cron slots are unchanged."""
    row, state = _locked_state(principal, def_id)
    now = timezone.now()
    if state.next_run_at is None or state.next_run_at > now:
        state.next_run_at = now
        state.save(update_fields=["next_run_at", "updated_at"])
    return {"def_id": row.id, "scheduled": "next-tick"}


@transaction.atomic
def schedule_pause(*, principal: Principal, def_id: str) -> dict[str, Any]:
    row, state = _locked_state(principal, def_id)
    state.paused_until = PAUSED_FOREVER
    state.save(update_fields=["paused_until", "updated_at"])
    return {"def_id": row.id, "paused": True}


@transaction.atomic
def schedule_resume(*, principal: Principal, def_id: str) -> dict[str, Any]:
    """Clears the pause; slots that passed while paused are not fired (the next is after now)."""
    row, state = _locked_state(principal, def_id)
    if state.paused_until is not None:
        state.paused_until = None
        state.next_run_at = _next(row, timezone.now())
        state.save(update_fields=["paused_until", "next_run_at", "updated_at"])
    return {"def_id": row.id, "paused": False}


def schedule_state(*, principal: Principal, def_id: str) -> dict[str, Any]:
    row = selectors.schedule_def_get(tenant_id=principal.read_tenant, def_id=def_id)
    state = selectors.schedule_state_find(def_id=row.id)
    next_run_at = state.next_run_at if state is not None else _next(row, timezone.now())
    return presenters.state_out(row, state, next_run_at)


def schedules_list(*, principal: Principal, tenant: str | None) -> dict[str, Any]:
    """`list-all`: a non-admin sees its own tenant whatever `tenant` says; an admin all, or `tenant` only."""
    tenant_id = principal.tenant_id if not principal.is_admin else tenant
    now = timezone.now()
    entries = [
        presenters.entry_out(row, state, state.next_run_at if state is not None else _next(row, now))
        for row, state in selectors.schedules_active(tenant_id=tenant_id)
    ]
    return {"entries": entries}


def schedule_activated(sender: str, *, def_id: str, previous_def_id: str | None, at: datetime, **_: Any) -> None:
    """substrate's version_activated receiver: ScheduleDefs only."""
    if sender == "schedule":
        schedule_version_activated(def_id=def_id, previous_def_id=previous_def_id, at=at)


# --- the end of a trigger's run -----------------------------------------------------


HOOKS_TASK = "maintenance.triggers_run_finished"


def trigger_run_finished(run_id: str, status: str) -> None:
    """The apps.runs.registry.on_run_finished listener (called on the engine's path, inside
    its admission slot and before the run's fairness slot is freed): a completed run with
    hooks pending gets its own Celery task (`HOOKS_TASK`), so a hook waiting on an MCP
    server holds neither slot; anything else (no hook to run) is recorded here at once.
    A lost message is made up by `triggers_finished_sweep`; a duplicate finds the claim gone."""
    if status == RunStatus.COMPLETED and OnCompleteJob.objects.filter(run_id=run_id, state=JobState.PENDING).exists():
        current_app.send_task(HOOKS_TASK, kwargs={"run_id": run_id, "status": status})
        return
    trigger_run_finished_now(run_id, status)


def trigger_run_finished_now(run_id: str, status: str) -> None:
    """Hooks first (apps.triggers.oncomplete: at most once per run), then the fire's record."""
    results = oncomplete_run(run_id, status)
    schedule_run_finished(run_id=run_id, status=status, hook_results=results)


def schedule_run_finished(*, run_id: str, status: str, hook_results: list[dict[str, Any]] | None) -> None:
    fire = selectors.schedule_fire_for_run(run_id=run_id)
    if fire is None:
        return  # not a schedule's run (a webhook's, later)
    changes: dict[str, Any] = {"run_status": status}
    if hook_results is not None:
        changes["hook_results"] = hook_results
    ScheduleFire.objects.filter(pk=fire.pk).update(**changes)
    failed = [r for r in hook_results or [] if not r.get("ok")]
    error = "" if status == "completed" else f"run ended {status}"
    if failed:
        error = "; ".join(f"on_complete {r['kind']}: {r.get('error', '')}" for r in failed)
    # Only while this run is still the schedule's latest: an older run ending late changes nothing.
    ScheduleState.objects.filter(schedule_def_id=fire.schedule_def_id, last_run_id=run_id).update(
        last_status=status, last_error=error
    )


def triggers_finished_sweep(*, grace_seconds: float, batch: int = 500, max_scanned: int = 20_000) -> int:
    """Trigger runs that ended without the engine's announcement reaching us
    (its process died after the commit, or the run ended outside the engine:
    a cancel): announce them now. Candidates are read in pages
    of `batch` (at most `max_scanned` per call) and only the ones whose run
    has ended are handled, so runs still going never fill a batch. Every
    statement reads one table: a statement holding a lock on one table while
    waiting for another could deadlock with a TRUNCATE of both. Returns how
    many were handled."""
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    jobs = OnCompleteJob.objects.filter(state=JobState.PENDING, created_at__lt=cutoff)
    fires = ScheduleFire.objects.filter(outcome=FireOutcome.STARTED, run_status="", fired_at__lt=cutoff)
    ended = _ended_runs(jobs, batch, max_scanned) | _ended_runs(fires, batch, max_scanned)
    for run_id, status in ended.items():
        trigger_run_finished_now(run_id, status)
    return len(ended)


def _ended_runs(candidates: QuerySet[Any, Any], batch: int, max_scanned: int) -> dict[str, str]:
    """{run_id: terminal status} of up to `batch` candidates whose run ended,
    read in primary-key pages (every candidate is reached, however many runs
    are still going)."""
    found: dict[str, str] = {}
    after: Any = None
    scanned = 0
    while len(found) < batch and scanned < max_scanned:
        page = candidates if after is None else candidates.filter(pk__gt=after)
        rows = list(page.order_by("pk").values_list("run_id", "pk")[:batch])
        if not rows:
            break
        scanned += len(rows)
        after = rows[-1][1]
        statuses = run_statuses(run_ids=[run_id for run_id, _ in rows if run_id])
        found.update({r: st for r, st in statuses.items() if st in TERMINAL})
    return dict(list(found.items())[:batch])


def triggers_prune(*, retention_days: int) -> tuple[int, int]:
    """Delete fire rows fired more than `retention_days` ago (each schedule's
    latest fire is kept, for its state and the admin) and on_complete jobs
    done that long ago. -> (fires, jobs) deleted."""
    cutoff = timezone.now() - timedelta(days=retention_days)
    latest = ScheduleFire.objects.values("tenant_id", "schedule_name").annotate(newest=Max("id")).values("newest")
    fires, _ = ScheduleFire.objects.filter(fired_at__lt=cutoff).exclude(id__in=latest).delete()
    jobs, _ = OnCompleteJob.objects.filter(state=JobState.DONE, finished_at__lt=cutoff).delete()
    return fires, jobs
