"""Webhook admin REST (SPEC 2.10), behind the bearer gate with substrate:admin
(every `/v1/_*` route not listed otherwise needs it: apps.substrate.auth)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from apps.core.http import request_principal
from apps.core.timefmt import ts
from apps.triggers.schemas import WebhookDeliveriesOut, WebhookDryRunOut
from apps.triggers.webhooks import selectors
from apps.triggers.webhooks.receive import webhook_dry_run

router = Router(tags=["webhooks"])
DEFAULT_RECENT = 50
DRY_RUN_MAX_BYTES = 16 * 1024 * 1024


@router.get("/_webhooks/{name}/recent-deliveries", response=WebhookDeliveriesOut)
def webhooks_recent_deliveries(request: HttpRequest, name: str, limit: int = DEFAULT_RECENT) -> dict[str, Any]:
    principal = request_principal(request)
    rows = selectors.recent_deliveries(name=name, tenant_id=principal.read_tenant, limit=limit)
    deliveries = [
        {
            "delivery_id": r["delivery_id"],
            "verdict": r["verdict"],
            "received_at": ts(r["received_at"]),
            "run_id": r["run_id"],
            "channel": r["channel"],
            "tenant_id": r["tenant_id"],
            "detail": r["detail"],
        }
        for r in rows
    ]
    return {"webhook_name": name, "deliveries": deliveries}


@router.post("/_webhooks/{name}/test", response=WebhookDryRunOut, exclude_unset=True)
def webhooks_test(request: HttpRequest, name: str, tenant: str = "") -> dict[str, Any]:
    """Dry run: the request body is the payload a delivery would carry."""
    principal = request_principal(request)
    body = request.read(DRY_RUN_MAX_BYTES)
    return webhook_dry_run(
        tenant=tenant if principal.read_tenant is None else principal.tenant_id, name=name, body=body
    )
