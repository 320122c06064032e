"""Deleting run trees: DELETE /v1/runs/{id}, the DeleteRunTree RPC, retention and erasure.

Invariants:
- Only a tree whose every run is terminal is deleted, in ONE transaction that locks its rows
  and re-reads their status (apps.runs.store.deletion); anything live keeps the whole tree.
- The usage ledger keeps its rows: their run reference is cleared in the same transaction
  (apps.gateway.erasure), so spend totals stay true.
- Apps holding rows about runs that do not cascade from Run (evaluations, inbound webhook
  deliveries, on_complete jobs) register `on_runs_deleted` at ready(), as tools register:
  runs never imports them. Listeners run inside the deleting transaction.
- `?cancel=true` on a live tree cancels it and marks its root `no_trace`, so its end deletes
  it (apps.lifecycle's run-finished listener; beat's retention sweep is the backstop).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.db import transaction

from apps.core.errors import Conflict
from apps.core.types import Principal
from apps.gateway import erasure as ledger
from apps.runs import cancel
from apps.runs.models import Run
from apps.runs.selectors import run_get
from apps.runs.store import deletion as store

RunsDeleted = Callable[[str, list[str]], dict[str, int]]  # (tenant id, run ids) -> rows removed per table
_LISTENERS: list[RunsDeleted] = []


def on_runs_deleted(listener: RunsDeleted) -> None:
    """Call `listener(tenant_id, run_ids)` inside every transaction that deletes runs (one
    tree: one tenant). Idempotent."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


@dataclass(frozen=True)
class TreeDeleted:
    deleted_runs: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    live: tuple[str, ...] = ()  # the tree's live runs when it was kept


def tree_delete(*, root_id: str) -> TreeDeleted:
    """Delete `root_id`'s tree if every run of it is terminal, else nothing (`live` says
    why). Its own transaction: a crash leaves the tree whole or gone."""
    with transaction.atomic():
        ids = store.tree_ids(root_ids=[root_id])
        live = store.live_in(run_ids=ids, lock=True)
        if live or not ids:
            return TreeDeleted(live=tuple(live))
        tenant_id = Run.objects.filter(id=root_id).values_list("tenant_id", flat=True).first() or ""
        return TreeDeleted(deleted_runs=len(ids), counts=_delete(tenant_id, ids))


def trees_delete(*, root_ids: Sequence[str]) -> TreeDeleted:
    """`tree_delete` for several roots, each in its own transaction; totals."""
    counts: Counter[str] = Counter()
    runs = 0
    for root_id in root_ids:
        one = tree_delete(root_id=root_id)
        runs += one.deleted_runs
        counts.update(one.counts)
    return TreeDeleted(deleted_runs=runs, counts=dict(counts))


def _delete(tenant_id: str, ids: list[str]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    counts["gateway.UsageEntry(run reference cleared)"] += ledger.usage_run_refs_clear(run_ids=ids)
    for listener in list(_LISTENERS):
        counts.update(listener(tenant_id, ids))
    counts.update(store.runs_delete(run_ids=ids))
    return {name: n for name, n in counts.items() if n}


def run_tree_delete(*, principal: Principal, run_id: str, cancel_live: bool = False) -> dict[str, object]:
    """DELETE /v1/runs/{id}: the run (another tenant's, or another user's for an isolated
    member, is a 404) and its descendants. A live tree is a 409 `run_live` unless
    `cancel_live`: then it is cancelled and deleted when it ends (202 `deleting`)."""
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    result = tree_delete(root_id=run.id)
    if not result.live:
        return _body(run, result, deleting=False)
    if not cancel_live:
        raise Conflict(
            f"run {run.id} has live runs in its tree; cancel it first or pass ?cancel=true",
            code="run_live",
            details={"live_run_ids": list(result.live)},
        )
    store.mark_no_trace(run_id=run.id)
    cancel.run_cancel(principal=principal, run_id=run.id, reason="deleted by api")
    result = tree_delete(root_id=run.id)  # parked runs end at once: the tree may be gone already
    return _body(run, result, deleting=bool(result.live))


def session_trees_delete(*, principal: Principal, session_id: str) -> dict[str, object]:
    """Every ended run tree of a session (DeleteRunTree by session_id). A session holding a
    live run deletes nothing (409 run_live); an unknown or foreign one deletes nothing."""
    qs = Run.objects.filter(session_id=session_id, parent__isnull=True)
    if principal.read_tenant is not None:
        qs = qs.filter(tenant_id=principal.read_tenant)
    if principal.read_user is not None:
        qs = qs.filter(user_id=principal.read_user)
    roots = list(qs.values_list("id", flat=True))
    live = store.live_in(run_ids=store.tree_ids(root_ids=roots), lock=False)
    if live:
        raise Conflict(f"session {session_id} has live runs; cancel them first", code="run_live")
    result = trees_delete(root_ids=roots)
    return {"run_id": "", "session_id": session_id, "deleted_runs": result.deleted_runs, "counts": result.counts}


def _body(run: Run, result: TreeDeleted, *, deleting: bool) -> dict[str, object]:
    return {
        "run_id": run.id,
        "session_id": run.session_id,
        "deleted": not deleting,  # False: cancelled, deleted by its end (202)
        "deleted_runs": result.deleted_runs,
        "counts": result.counts,
        "deleting": deleting,
        "kept": {"gateway.UsageEntry": "usage ledger rows are kept with their run reference cleared"},
    }
