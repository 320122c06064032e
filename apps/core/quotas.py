"""Per-tenant counts of rows a tenant writes (issue 33): runtime channels and
dynamic volumes, and definition names (apps.substrate.quotas) all call these. A refusal is
429 `tenant_quota_exceeded` with `{resource, tenant_id, cap}` in its details:
the tenant may retry once it has deleted one (nothing frees by itself, so no
Retry-After). The count and the insert share a transaction, serialised per
(resource, tenant) by an advisory lock, so concurrent creates never pass the cap."""

from __future__ import annotations

from django.db import connection

from apps.core.errors import QuotaExhausted


class TenantQuotaExceeded(QuotaExhausted):
    code = "tenant_quota_exceeded"


def tenant_count_lock(resource: str, tenant_id: str) -> None:
    """Inside the creating transaction: serialise the tenant's creates of `resource` to its commit."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"quota:{resource}:{tenant_id}"])


def tenant_count_check(
    *, resource: str, tenant_id: str, held: int, cap: int, setting: str, remedy: str = "delete one first"
) -> None:
    """Refuse one more `resource` when the tenant holds `cap` already; `remedy` tells it how to free a place."""
    if held < cap:
        return
    raise TenantQuotaExceeded(
        f"this tenant already holds {held} {resource}, the most it may ({setting}={cap}); {remedy}",
        details={"resource": resource, "tenant_id": tenant_id, "cap": cap},
    )
