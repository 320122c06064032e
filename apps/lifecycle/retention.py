"""Retention: ended run trees are deleted a number of days after they end.

Where the age comes from, most specific first: a (tenant, agent) policy, then the tenant's,
then LOOMCYCLE_RETENTION_DAYS for every tenant. Policies set over `/v1/_retention`
(RetentionPolicy rows) win over yaml's `retention:` block at the same (tenant, agent). 0 days
keeps forever. A no-trace tree (apps.lifecycle.notrace) is deleted when it ends; this sweep
deletes any its end did not.

The sweep (`retention_sweep`, beat's `retention-sweep`) is bounded and kill-safe: each
index read takes at most LOOMCYCLE_RETENTION_BATCH trees, each tree is deleted in its own
short transaction (apps.runs.deletion.tree_delete: everything of the tree or nothing), and a
pass stops after LOOMCYCLE_RETENTION_MAX_BATCHES reads; a kill loses at most the tree being
deleted, whose transaction rolls back. The reads use the partial indexes on ended top-level
runs (apps.runs.retention; tests/lifecycle/test_retention.py proves it with EXPLAIN).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.core.config import runtime_config
from apps.lifecycle.models import RetentionPolicy
from apps.lifecycle.notrace import no_trace_settle
from apps.runs import deletion
from apps.runs import retention as runs

Key = tuple[str, str]  # (tenant, agent); agent "" = the tenant's default
Page = Callable[[runs.Cursor, int], list[tuple[str, datetime]]]


def yaml_policies() -> dict[Key, int]:
    """yaml `retention: {tenants: {<tenant>: {days: N, agents: {<agent>: N}}}}`."""
    block = runtime_config().get("retention") or {}
    found: dict[Key, int] = {}
    for tenant, raw in (block.get("tenants") or {}).items():
        raw = raw or {}
        if raw.get("days") is not None:
            found[(str(tenant), "")] = int(raw["days"])
        for agent, days in (raw.get("agents") or {}).items():
            found[(str(tenant), str(agent))] = int(days)
    return found


def default_days() -> int:
    """Every tenant's age unless a policy says otherwise: yaml `retention.default_days`, else env."""
    block = runtime_config().get("retention") or {}
    days = block.get("default_days")
    return int(days) if days is not None else settings.LOOMCYCLE.retention_days


def policies() -> dict[Key, int]:
    """Every (tenant, agent) age in force: yaml, then the rows set over the API."""
    found = yaml_policies()
    found.update({(p.tenant_id, p.agent_name): p.max_age_days for p in RetentionPolicy.objects.all()})
    return found


@dataclass
class SweepResult:
    trees: int = 0
    runs: int = 0
    kept_live: int = 0
    batches: int = 0
    counts: Counter[str] = field(default_factory=Counter)


def _drain(page: Page, result: SweepResult, *, delete: Callable[[str], int]) -> None:
    """Read pages of due roots and delete each tree, until none is left or the pass's budget is spent."""
    cursor: runs.Cursor = None
    batch = settings.LOOMCYCLE.retention_batch
    while result.batches < settings.LOOMCYCLE.retention_max_batches:
        rows = page(cursor, batch)
        result.batches += 1
        for run_id, _ in rows:
            deleted = delete(run_id)
            result.trees += deleted > 0
            result.runs += deleted
            result.kept_live += deleted == 0
        if len(rows) < batch:
            return
        cursor = (rows[-1][1], rows[-1][0])


def _tree(result: SweepResult) -> Callable[[str], int]:
    def delete(root_id: str) -> int:
        one = deletion.tree_delete(root_id=root_id)
        result.counts.update(one.counts)
        return one.deleted_runs

    return delete


def _no_trace(root_id: str) -> int:
    return 1 if no_trace_settle(run_id=root_id) else 0


def _expired(**filters: Any) -> Page:
    """A page of due roots under one policy (apps.runs.retention.expired_roots)."""
    return partial(_expired_page, filters)


def _expired_page(filters: dict[str, Any], after: runs.Cursor, limit: int) -> list[tuple[str, datetime]]:
    return runs.expired_roots(after=after, limit=limit, **filters)


def _policy_pages(now: datetime, found: dict[Key, int]) -> list[Page]:
    pages: list[Page] = []
    agents = [key for key in found if key[1]]
    tenants = [key[0] for key in found if not key[1]]
    for (tenant, agent), days in found.items():
        if days <= 0:
            continue
        before = now - timedelta(days=days)
        if agent:
            pages.append(_expired(before=before, tenant_id=tenant, agent_name=agent))
        else:
            own = [k for k in agents if k[0] == tenant]
            pages.append(_expired(before=before, tenant_id=tenant, skip_agents=own))
    days = default_days()
    if days > 0:
        pages.append(_expired(before=now - timedelta(days=days), skip_tenants=tenants, skip_agents=agents))
    return pages


def retention_sweep(*, now: datetime | None = None) -> SweepResult:
    """One bounded pass: no-trace trees first, then each policy's due trees."""
    result = SweepResult()
    _drain(lambda c, n: runs.no_trace_ended(after=c, limit=n), result, delete=_no_trace)
    for page in _policy_pages(now or timezone.now(), policies()):
        _drain(page, result, delete=_tree(result))
    return result
