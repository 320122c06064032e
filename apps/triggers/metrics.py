"""Counters of the triggers app (apps.core.metrics; docs/operations.md lists them).
Labels are fixed vocabularies: a fire's outcome, a delivery's verdict; never a
schedule or webhook name (tenant-chosen, unbounded)."""

from __future__ import annotations

from apps.core.metrics import Counter

SCHEDULE_FIRES = Counter("loomcycle_schedule_fires", "Schedule fires recorded, by outcome.", ("outcome",))
WEBHOOK_DELIVERIES = Counter(
    "loomcycle_webhook_deliveries", "Webhook delivery records written, by verdict.", ("verdict",)
)
