"""The beat schedule: the sweeps, and the scheduler tick that fires ScheduleDefs (apps.triggers.schedules).

settings.py builds it while Django settings load, so the periods come in as
arguments (from `settings.LOOMCYCLE`) rather than being read here."""

from __future__ import annotations

from typing import Any


def _every(task: str, seconds: float) -> dict[str, Any]:
    """A periodic task whose message expires after one period (at least 1 s), so
    ticks no worker took in time do not pile up."""
    return {"task": task, "schedule": seconds, "options": {"expires": max(seconds, 1.0)}}


def beat_schedule(
    *,
    sweep_s: float,
    memory_sweep_s: float,
    channels_wake_tick_s: float,
    channels_sweep_s: float,
    interrupts_sweep_s: float,
    scheduler_tick_s: float | None = None,
    retention_sweep_s: float = 300.0,
    a2a_poll_s: float = 5.0,
) -> dict[str, dict[str, Any]]:
    """`scheduler_tick_s` None: no scheduler tick (LOOMCYCLE_SCHEDULER_ENABLED unset). One
    tick entry, not one entry per schedule: the due schedules are read from Postgres by the
    tick (docs/architecture.md says why), so any number of beats may send it."""
    tick = {"schedules-tick": _every("maintenance.schedules_tick", scheduler_tick_s)} if scheduler_tick_s else {}
    return tick | {
        "run-leases-sweep": _every("maintenance.run_leases_sweep", sweep_s),
        "children-report-sweep": _every("maintenance.children_report_sweep", sweep_s),
        "run-slots-reconcile": _every("maintenance.run_slots_reconcile", sweep_s),
        "runs-admission-sweep": _every("maintenance.runs_admission_sweep", sweep_s),
        "memory-expired-sweep": _every("maintenance.memory_expired_sweep", memory_sweep_s),
        "channels-wake-due": _every("channels.wake_due", channels_wake_tick_s),
        "channels-expired-sweep": _every("maintenance.channels_expired_sweep", channels_sweep_s),
        "interrupts-expire": _every("maintenance.interrupts_expire", interrupts_sweep_s),
        "resident-sweep": _every("maintenance.resident_sweep", sweep_s),
        "gateway-audit-prune": _every("maintenance.gateway_audit_prune", 3600.0),
        "triggers-finished-sweep": _every("maintenance.triggers_finished_sweep", sweep_s),
        "budgets-wake": _every("maintenance.budgets_wake", sweep_s),
        "budget-holds-sweep": _every("maintenance.budget_holds_sweep", sweep_s),
        "retention-sweep": _every("maintenance.retention_sweep", retention_sweep_s),
        "erasure-resume": _every("maintenance.erasure_resume", retention_sweep_s),
        "run-webhooks-sweep": _every("maintenance.run_webhooks_sweep", sweep_s),
        "a2a-calls-due": _every("maintenance.a2a_calls_due", a2a_poll_s),
    }
