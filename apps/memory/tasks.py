"""Thin Celery adapters over the memory services.

Invariant: expired rows are already invisible to every read; the sweep only
reclaims their space, so a late or overlapping sweep is harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.memory import services
from workers.base import AgentTask


@shared_task(base=AgentTask, name="maintenance.memory_expired_sweep")
def memory_expired_sweep_task(**_: Any) -> int:
    """Delete expired memory rows in batches; idempotent, safe to overlap."""
    return services.memory_expired_sweep()
