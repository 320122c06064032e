"""`GET /v1/_concurrency/stats` (SPEC 2.4). The scope table makes every
`/v1/_*` route not listed otherwise substrate:admin.

Live run counts come from Postgres; the per-user, per-tenant and provider
figures are the fairness slots held in Redis across the whole cluster. It
lives in runs because it reads both (the gateway knows nothing of runs)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from apps.gateway import fairness
from apps.runs.selectors import runs_live_counts

router = Router(tags=["admin"])


class ProviderSlotsOut(Schema):
    active: int
    queued: int
    cap: int


class CapsOut(Schema):
    per_user: int
    per_tenant: int


class ConcurrencyStatsOut(Schema):
    active: int  # live runs past `queued` (running or parked), every tenant
    queued: int  # runs not yet claimed by a worker, or waiting for an admission slot
    per_user: dict[str, int]
    per_tenant: dict[str, int]
    providers: dict[str, ProviderSlotsOut]
    caps: CapsOut


@router.get(
    "/_concurrency/stats",
    response=ConcurrencyStatsOut,
    summary="Live runs, and the fairness slots held per user, tenant and provider",
)
def concurrency_stats(request: HttpRequest) -> dict[str, Any]:
    return {**runs_live_counts(), **fairness.slots_stats()}
