"""The usage ledger's part in deleting runs and erasing a person: rows are kept, so spend
totals stay true; what ties them to a run or a person is cleared. Bounded by the caller's
batch (run ids) or by `limit` rows per call, each call in the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence

from apps.gateway.models import GatewayCall, UsageEntry


def usage_run_refs_clear(*, run_ids: Sequence[str]) -> int:
    """Clear the run reference of these runs' ledger rows (index `usage_run`)."""
    if not run_ids:
        return 0
    return UsageEntry.objects.filter(run_id__in=list(run_ids)).update(run_id="")


def usage_user_count(*, tenant_id: str, user_id: str) -> dict[str, int]:
    """Ledger and gateway-audit rows naming this person (indexes led by tenant, user)."""
    return {
        "gateway.UsageEntry": UsageEntry.objects.filter(tenant_id=tenant_id, user_id=user_id).count(),
        "gateway.GatewayCall": GatewayCall.objects.filter(tenant_id=tenant_id, user_id=user_id).count(),
    }


def usage_user_anonymise_batch(*, tenant_id: str, user_id: str, limit: int) -> int:
    """Up to `limit` ledger rows, then gateway-audit rows, of this person lose their user and
    run reference (the amounts stay). Rows changed; 0 when none is left."""
    ids = list(UsageEntry.objects.filter(tenant_id=tenant_id, user_id=user_id).values_list("pk", flat=True)[:limit])
    if ids:
        return UsageEntry.objects.filter(pk__in=ids).update(user_id="", run_id="")
    calls = list(GatewayCall.objects.filter(tenant_id=tenant_id, user_id=user_id).values_list("pk", flat=True)[:limit])
    return GatewayCall.objects.filter(pk__in=calls).update(user_id="") if calls else 0
