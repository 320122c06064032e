"""Webhook reads: the definition a path addresses, first deliveries (the
dedupe key), and recent delivery records for the admin routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from apps.substrate.kinds import get_kind
from apps.substrate.selectors import def_resolve
from apps.triggers.webhooks.models import WebhookDelivery

MAX_RECENT = 200


@dataclass(frozen=True)
class Hook:
    """A resolved WebhookDef: `owner` is the tenant the def row belongs to (the
    dedupe and rate-limit namespace), `run_tenant` the tenant its runs get."""

    name: str
    owner: str
    run_tenant: str
    definition: dict[str, Any]

    @property
    def enabled(self) -> bool:
        return bool(self.definition.get("enabled", True))


def webhook_resolve(*, tenant_id: str, name: str) -> Hook | None:
    """The tenant's active WebhookDef `name`, else the shared one (SPEC 9.2 step 1)."""
    row = def_resolve(get_kind("webhook"), tenant_id=tenant_id, name=name)
    if row is None:
        return None
    definition: dict[str, Any] = row.definition
    run_tenant = row.tenant_id or str(definition.get("tenant_id") or "")
    return Hook(name=name, owner=row.tenant_id, run_tenant=run_tenant, definition=definition)


def first_delivery(*, owner: str, name: str, delivery_id: str, signed: str = "") -> WebhookDelivery | None:
    """The delivery that was acted on under this delivery id or, when `signed` is
    given, for these signed bytes (a re-send under a fresh id); the oldest if both."""
    key = Q(delivery_id=delivery_id) | Q(signed_sha256=signed) if signed else Q(delivery_id=delivery_id)
    return WebhookDelivery.objects.filter(key, tenant_id=owner, webhook_name=name, first=True).order_by("id").first()


def recent_deliveries(*, name: str, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
    """Newest first; `tenant_id` None means every tenant (an admin's view)."""
    rows = WebhookDelivery.objects.filter(webhook_name=name)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    fields = ("delivery_id", "verdict", "received_at", "run_id", "channel", "tenant_id", "detail")
    return list(rows.order_by("-received_at", "-id").values(*fields)[: max(1, min(limit, MAX_RECENT))])
