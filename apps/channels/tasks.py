"""Thin Celery adapters over the channel services and waits.

Invariants: expired messages are already invisible to every read, so the
sweep only reclaims space; `wake_due` claims due waits with SKIP LOCKED, so
overlapping ticks never answer one wait twice.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.channels import services, waits
from workers.base import AgentTask


@shared_task(base=AgentTask, name="channels.wake_due")
def channels_wake_due_task(**_: Any) -> int:
    """Answer parked Channel waits whose deadline passed or whose deferred message is visible."""
    return waits.waits_due()


@shared_task(base=AgentTask, name="maintenance.channels_expired_sweep")
def channels_expired_sweep_task(**_: Any) -> int:
    """Delete expired channel messages in batches; idempotent, safe to overlap."""
    return services.channels_expired_sweep()
