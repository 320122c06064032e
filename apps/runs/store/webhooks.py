"""The completion-webhook tables' writes (part of apps/runs/store/, the one package that writes the
runs app's tables): runs_runwebhook and runs_runwebhookdelivery (apps.runs.completion says when).

- `record` inserts the delivery row of a run's end or park inside the transaction that commits
  it, as one INSERT ... SELECT from the run's webhook row: a run with no webhook (or one that did
  not ask for this event) inserts nothing, and ON CONFLICT keeps a re-recorded event to one row.
- `claim` takes a due attempt by compare-and-set and pushes `next_attempt_at` a lease ahead, so
  the attempt's own crash leaves the row due again after the lease (the sweep re-sends it: at
  least once) and two doorbells for one row send it once.
- `settle` records an attempt's outcome: delivered, failed for good, or due again after a backoff.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.db.models import F
from django.utils import timezone

from apps.runs.completion.models import DeliveryState, RunWebhook, RunWebhookDelivery
from apps.runs.completion.spec import END_EVENTS, Webhook
from apps.runs.statuses import TERMINAL

BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 3600.0

_RECORD_SQL = """
INSERT INTO runs_runwebhookdelivery
  (id, run_id, tenant_id, user_id, event, step, url, secret_ref,
   state, attempts, last_error, next_attempt_at, created_at)
SELECT %(id)s::varchar, r.id, r.tenant_id, r.user_id, %(event)s::varchar, r.step, w.url, w.secret_ref,
   'pending', 0, '', now(), now()
FROM runs_runwebhook w JOIN runs_run r ON r.id = w.run_id
WHERE w.run_id = %(run_id)s AND jsonb_exists(w.events, %(event)s::text)
ON CONFLICT (run_id, event, step) DO NOTHING
RETURNING id
"""


def new_delivery_id() -> str:
    return f"whd_{time.time_ns():016x}{secrets.token_hex(4)}"


def attach(*, run_id: str, tenant_id: str, webhook: Webhook) -> None:
    """The run's webhook, inserted in the transaction that inserts the run."""
    RunWebhook.objects.create(
        run_id=run_id, tenant_id=tenant_id, url=webhook.url, secret_ref=webhook.secret_ref, events=list(webhook.events)
    )


def record(*, run_id: str, event: str) -> str | None:
    """The new delivery's id, None when the run has no webhook for `event` or it is recorded already.
    Call inside the transaction that commits the run's `event` (its end or park)."""
    with connection.cursor() as cur:
        cur.execute(_RECORD_SQL, {"id": new_delivery_id(), "run_id": run_id, "event": event})
        row = cur.fetchone()
        if event in END_EVENTS:
            cur.execute("UPDATE runs_runwebhook SET ended_recorded = true WHERE run_id = %s", [run_id])
    return str(row[0]) if row else None


@dataclass(frozen=True)
class Claimed:
    id: str
    run_id: str
    tenant_id: str
    event: str
    url: str
    secret_ref: str
    attempts: int  # this attempt's number (1 = the first)


def claim(*, delivery_id: str, lease_s: float) -> Claimed | None:
    """This attempt's row, or None (delivered, failed, not due, or another attempt holds it)."""
    now = timezone.now()
    # Compare-and-set on (state, due): of two doorbells or sweeps for one row, one updates it.
    updated = RunWebhookDelivery.objects.filter(
        id=delivery_id, state=DeliveryState.PENDING, next_attempt_at__lte=now
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=lease_s))
    if not updated:
        return None
    row = RunWebhookDelivery.objects.get(id=delivery_id)
    return Claimed(row.id, row.run_id, row.tenant_id, row.event, row.url, row.secret_ref, row.attempts)


def backoff_s(attempts: int) -> float:
    """Exponential from BACKOFF_BASE_S, capped, with full jitter on its upper half."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(attempts - 1, 0))
    return float(ceiling / 2 + random.uniform(0, ceiling / 2))


def settle(*, claimed: Claimed, status: int | None, error: str, max_attempts: int) -> str:
    """Record the attempt's outcome (2xx: delivered); the row's new state."""
    now = timezone.now()
    fields: dict[str, object] = {"last_status": status, "last_error": error[:4096]}
    if status is not None and 200 <= status < 300:
        fields |= {"state": DeliveryState.DELIVERED, "delivered_at": now, "last_error": ""}
    elif claimed.attempts >= max_attempts:
        fields |= {"state": DeliveryState.FAILED}
    else:
        fields |= {"next_attempt_at": now + timedelta(seconds=backoff_s(claimed.attempts))}
    RunWebhookDelivery.objects.filter(id=claimed.id, state=DeliveryState.PENDING).update(**fields)
    return str(fields.get("state", DeliveryState.PENDING))


def due(*, limit: int) -> list[str]:
    """Pending deliveries whose attempt is due (index runwebhookdelivery_due), oldest due first."""
    rows = RunWebhookDelivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=timezone.now())
    return list(rows.order_by("next_attempt_at").values_list("id", flat=True)[:limit])


def ended_unrecorded(*, limit: int) -> list[tuple[str, str]]:
    """(run_id, status) of ended runs whose end has no delivery row yet (an end path that did not
    record it): the sweep records them (index runwebhook_open: unrecorded webhooks only)."""
    rows = RunWebhook.objects.filter(ended_recorded=False, run__status__in=list(TERMINAL))
    return [(str(r), str(s)) for r, s in rows.values_list("run_id", "run__status")[:limit]]
