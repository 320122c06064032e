"""Thin Celery adapters over the gateway services.

Invariant: the audit trail keeps LOOMCYCLE_GATEWAY_AUDIT_RETENTION_DAYS of
rows (0 = forever); the usage ledger is never pruned here.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from apps.gateway import services
from workers.base import AgentTask


@shared_task(base=AgentTask, name="maintenance.gateway_audit_prune")
def gateway_audit_prune_task(**_: Any) -> int:
    """Delete gateway audit rows past the retention; idempotent, safe to overlap."""
    return services.gateway_audit_prune(retention_days=settings.LOOMCYCLE.gateway_audit_retention_days)
