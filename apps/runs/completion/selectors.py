"""Completion-webhook reads: a run's deliveries as the API and the admin show them."""

from __future__ import annotations

from typing import Any

from apps.core.timefmt import ts
from apps.runs.completion.models import RunWebhookDelivery

MAX_LISTED = 1000


def deliveries_of(*, run_id: str) -> list[dict[str, Any]]:
    """The run's deliveries, oldest first (a run has one per announced event)."""
    rows = RunWebhookDelivery.objects.filter(run_id=run_id).order_by("created_at", "id")[:MAX_LISTED]
    return [delivery_out(d) for d in rows]


def delivery_out(d: RunWebhookDelivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "run_id": d.run_id,
        "event": d.event,
        "url": d.url,
        "state": d.state,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "created_at": ts(d.created_at),
        "next_attempt_at": ts(d.next_attempt_at) if d.state == "pending" else None,
        "delivered_at": ts(d.delivered_at),
    }
