"""The beat schedule: the lease sweeper (ScheduleDef fires arrive with the substrate issue)."""

from __future__ import annotations

from typing import Any

from loomcycle_project import env as E


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {
        "run-leases-sweep": {
            "task": "maintenance.run_leases_sweep",
            "schedule": E.SWEEP_SECONDS,
            "options": {"expires": max(E.SWEEP_SECONDS, 1.0)},
        },
        "children-report-sweep": {
            "task": "maintenance.children_report_sweep",
            "schedule": E.SWEEP_SECONDS,
            "options": {"expires": max(E.SWEEP_SECONDS, 1.0)},
        },
        "run-slots-reconcile": {
            "task": "maintenance.run_slots_reconcile",
            "schedule": E.SWEEP_SECONDS,
            "options": {"expires": max(E.SWEEP_SECONDS, 1.0)},
        },
        "runs-admission-sweep": {
            "task": "maintenance.runs_admission_sweep",
            "schedule": E.SWEEP_SECONDS,
            "options": {"expires": max(E.SWEEP_SECONDS, 1.0)},
        },
        "memory-expired-sweep": {
            "task": "maintenance.memory_expired_sweep",
            "schedule": E.MEMORY_SWEEP_MS / 1000.0,
            "options": {"expires": max(E.MEMORY_SWEEP_MS / 1000.0, 1.0)},
        },
        "channels-wake-due": {
            "task": "channels.wake_due",
            "schedule": E.CHANNELS_WAKE_TICK_MS / 1000.0,
            "options": {"expires": max(E.CHANNELS_WAKE_TICK_MS / 1000.0, 1.0)},
        },
        "channels-expired-sweep": {
            "task": "maintenance.channels_expired_sweep",
            "schedule": E.CHANNELS_SWEEP_MS / 1000.0,
            "options": {"expires": max(E.CHANNELS_SWEEP_MS / 1000.0, 1.0)},
        },
        "gateway-audit-prune": {
            "task": "maintenance.gateway_audit_prune",
            "schedule": 3600.0,
            "options": {"expires": 3600.0},
        },
    }
