"""Writes of the gateway's audit trail and of the usage ledger.

Invariants:
- one `GatewayCall` row per gateway call, whatever its outcome (a refusal,
  a provider failure and a client that went away included);
- one `UsageEntry` per provider call that reported usage: a run step's
  entries are inserted by the engine's step-commit statement, through the
  SQL this app supplies (`usage_run_entries_insert_sql`), so they land iff
  the step does; a gateway chat call's entry is written with its audit row, in
  the same transaction, so the two never disagree;
- `cost_usd` is the list price from `pricing.cost_usd`, NULL when unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from apps.gateway.models import GatewayCall, UsageEntry, UsageSource
from apps.gateway.pricing import cost_usd
from apps.gateway.providers.base import Usage

PRUNE_BATCH = 5_000


@dataclass(frozen=True)
class CallRecord:
    """One finished gateway call, as the audit writer receives it."""

    request_id: str
    tenant_id: str
    user_id: str
    subject: str
    endpoint: str
    provider: str
    model: str
    stream: bool
    status_code: int
    error_code: str
    latency_ms: int
    created_at: datetime
    usage: Usage | None = None  # chat calls that reached the provider's final event

    def as_dict(self) -> dict[str, object]:
        """For the log line of a record that could not be stored."""
        out = {k: v for k, v in self.__dict__.items() if k != "usage"}
        out["created_at"] = self.created_at.isoformat()
        out["usage"] = self.usage.as_dict() if self.usage else None
        return out


def usage_entry_build(
    *, tenant_id: str, user_id: str, run_id: str, step: int | None, source: str, usage: Usage
) -> UsageEntry:
    """An unsaved ledger row for one provider call, priced now."""
    return UsageEntry(
        created_at=timezone.now(),
        tenant_id=tenant_id,
        user_id=user_id,
        run_id=run_id,
        step=step,
        source=source,
        provider=usage.provider,
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cost_usd=cost_usd(usage.provider, usage.model, usage),
    )


def usage_run_entries_insert_sql(
    *, entries: str, sources: str, run_id: str, step: str, tenant_id: str, user_id: str
) -> str:
    """The ledger's INSERT of a run step's entries, for the engine to embed as a
    writable CTE in its step commit (one statement: the entries land iff the
    step does, with no round trip of their own). Every argument is SQL the
    caller's statement defines: `entries` a jsonb array of {provider, model,
    input_tokens, output_tokens, cache_creation_input_tokens,
    cache_read_input_tokens, cost_usd (text or null)}, `sources` the FROM items
    it and the other expressions read. This app owns the table and its columns;
    the run id is a plain string here (the gateway knows nothing of runs)."""
    return f"""INSERT INTO {UsageEntry._meta.db_table} (created_at, tenant_id, user_id, run_id, step, source, provider,
    model, input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd)
  SELECT now(), {tenant_id}, {user_id}, {run_id}, {step}, '{UsageSource.RUN.value}', x.v->>'provider', x.v->>'model',
    (x.v->>'input_tokens')::int, (x.v->>'output_tokens')::int, (x.v->>'cache_creation_input_tokens')::int,
    (x.v->>'cache_read_input_tokens')::int, (x.v->>'cost_usd')::numeric
  FROM {sources}, jsonb_array_elements({entries}) AS x(v)"""


def _call_row(record: CallRecord) -> GatewayCall:
    usage = record.usage
    return GatewayCall(
        request_id=record.request_id,
        tenant_id=record.tenant_id,
        user_id=record.user_id,
        subject=record.subject,
        endpoint=record.endpoint,
        provider=record.provider,
        model=record.model,
        stream=record.stream,
        status_code=record.status_code,
        error_code=record.error_code,
        latency_ms=record.latency_ms,
        input_tokens=usage.input_tokens if usage else 0,
        output_tokens=usage.output_tokens if usage else 0,
        created_at=record.created_at,
    )


def _usage_row(record: CallRecord) -> UsageEntry | None:
    if record.usage is None:
        return None
    # The provider's own model name (a dated snapshot, say) is what gets priced.
    usage = replace(
        record.usage,
        model=record.usage.model or record.model,
        provider=record.usage.provider or record.provider,
    )
    entry = usage_entry_build(
        tenant_id=record.tenant_id,
        user_id=record.user_id,
        run_id="",
        step=None,
        source=UsageSource.GATEWAY,
        usage=usage,
    )
    entry.created_at = record.created_at
    return entry


def gateway_calls_save(*, records: list[CallRecord]) -> int:
    """Store a batch of finished calls (audit rows + their ledger entries) in one transaction."""
    calls = [_call_row(r) for r in records]
    entries = [e for e in (_usage_row(r) for r in records) if e is not None]
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Two tables in one transaction can deadlock with a statement that locks both in the
            # other order (a TRUNCATE of both, as the test suite's flush does): wait at most
            # 200 ms and let the writer retry the batch later, so the other statement goes through.
            cursor.execute("SET LOCAL lock_timeout = '200ms'")
        GatewayCall.objects.bulk_create(calls)
        if entries:
            UsageEntry.objects.bulk_create(entries)
    return len(calls)


def gateway_audit_prune(*, retention_days: int, now: datetime | None = None) -> int:
    """Delete audit rows older than the retention (0 = keep forever), in
    batches so no single statement holds many row locks. The ledger is kept."""
    if retention_days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=retention_days)
    deleted = 0
    while True:
        ids = list(GatewayCall.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[:PRUNE_BATCH])
        if not ids:
            return deleted
        deleted += GatewayCall.objects.filter(id__in=ids).delete()[0]
