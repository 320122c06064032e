"""What triggers keep about runs goes with a deleted run tree (apps.runs.deletion, registered
at TriggersConfig.ready()): inbound webhook deliveries that started the runs (their record
names the run) and the runs' on_complete jobs (their hooks and results). Schedule fire rows
keep their history; their run id then names nothing."""

from __future__ import annotations

from apps.triggers.models import OnCompleteJob
from apps.triggers.webhooks.models import WebhookDelivery


def trigger_rows_of_runs_delete(tenant_id: str, run_ids: list[str]) -> dict[str, int]:
    """Delete these runs' delivery records (index `webhookdelivery_run`) and on_complete jobs (pk)."""
    counts: dict[str, int] = {}
    deliveries, _ = WebhookDelivery.objects.filter(tenant_id=tenant_id, run_id__in=run_ids).delete()
    jobs, _ = OnCompleteJob.objects.filter(run_id__in=run_ids).delete()
    if deliveries:
        counts["triggers.WebhookDelivery"] = deliveries
    if jobs:
        counts["triggers.OnCompleteJob"] = jobs
    return counts


def deliveries_of_runs_count(tenant_id: str, run_ids: list[str]) -> int:
    """The delivery records that started these runs (an erasure's report)."""
    return WebhookDelivery.objects.filter(tenant_id=tenant_id, run_id__in=run_ids).count()
