"""Erasing one person (a user id within a tenant): report what is held about them, and remove it.

Invariants:
- The tenant is the caller's (never a request field): a user id is unique only within a tenant,
  so another tenant's person cannot be named, let alone erased.
- Each app removes its own rows through its own service (apps.runs.deletion for run trees and
  what goes with them, apps.memory.erasure, apps.channels.erasure, apps.gateway.erasure for the
  ledger, which is anonymised, not deleted: spend totals stay true); never their SQL here.
- Bounded: every step is at most LOOMCYCLE_ERASURE_BATCH rows (or run trees), in its own
  transaction together with the audit row's counts, so the counts are exact after a crash.
- Resumable: the audit row (`Erasure`) stays `running` until every plane is empty; executing
  the same person again, or beat's `erasure-resume`, continues it. A live run of the person is
  cancelled and deleted once it has ended (a later continuation).
- The audit row says who (tenant, user id), who asked, when, and rows per table: no content.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.channels import erasure as channels
from apps.core.errors import Invalid
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.gateway import erasure as ledger
from apps.lifecycle.models import Erasure, ErasureStatus
from apps.memory import erasure as memory
from apps.runs import cancel, deletion
from apps.runs import retention as runs
from apps.triggers import erasure as triggers

RETAINED = {
    "gateway.UsageEntry": "the usage ledger is kept for spend totals; its user and run references are cleared",
    "snapshots.Snapshot": "operator snapshots are exports taken before the erasure; delete them over /v1/_snapshots",
}
NOTES = [
    "memory in agent or tenant scopes, and channel messages others published about this person, are not keyed "
    "by them and are not reached (tier3_residue is not examined: rows 0 with sessions_examined 0 means unknown)",
]
Batch = Callable[[str, str, int], int]  # (tenant, user, limit) -> rows removed; 0: the plane is empty


def _subject(user_id: str) -> str:
    if not user_id or not is_ident(user_id):
        raise Invalid("subject must be a user id matching [A-Za-z0-9_-]{1,128}", code="invalid_subject")
    return user_id


def erasure_report(*, principal: Principal, user_id: str) -> dict[str, Any]:
    """What this deployment holds about the person, per table (read-only)."""
    tenant, user = principal.tenant_id, _subject(user_id)
    covered = {
        **runs.user_runs_count(tenant_id=tenant, user_id=user),
        **memory.memory_user_count(tenant_id=tenant, user_id=user),
        **channels.channels_user_count(tenant_id=tenant, user_id=user),
        **ledger.usage_user_count(tenant_id=tenant, user_id=user),
    }
    ids = runs.user_run_ids(tenant_id=tenant, user_id=user, limit=10_000)
    through_runs = {"triggers.WebhookDelivery": triggers.deliveries_of_runs_count(tenant, ids)}
    return {
        "tenant": tenant,
        "subject": user,
        "tier1_covered": {"counts": covered, "total": sum(covered.values())},
        "tier2_uncovered": {"counts": through_runs, "total": sum(through_runs.values())},
        "tier3_residue": {"rows": 0, "scopes": [], "sessions_examined": 0, "truncated": len(ids) >= 10_000},
        "notes": list(NOTES),
        "errors": [],
    }


def erasure_execute(*, principal: Principal, user_id: str, dry_run: bool = True, confirm: str = "") -> dict[str, Any]:
    """Erase the person (dry run by default: the report, nothing removed). A real run needs
    `confirm` equal to the subject."""
    user = _subject(user_id)
    if dry_run:
        return {**erasure_report(principal=principal, user_id=user), "dry_run": True}
    if confirm != user:
        raise Invalid("confirm must equal subject to erase", code="confirm_mismatch")
    job = _open(tenant_id=principal.tenant_id, user_id=user, requested_by=principal.subject)
    return erasure_body(erasure_continue(erasure_id=job.id))


def _open(*, tenant_id: str, user_id: str, requested_by: str) -> Erasure:
    """The person's running erasure, or a new one (the partial unique index keeps it one)."""
    running = Erasure.objects.filter(tenant_id=tenant_id, user_id=user_id, status=ErasureStatus.RUNNING).first()
    if running is not None:
        return running
    try:
        with transaction.atomic():
            return Erasure.objects.create(
                id=f"er_{secrets.token_hex(8)}", tenant_id=tenant_id, user_id=user_id, requested_by=requested_by
            )
    except IntegrityError:  # a concurrent execute of the same person opened it first
        return Erasure.objects.get(tenant_id=tenant_id, user_id=user_id, status=ErasureStatus.RUNNING)


def _count(erasure_id: str, removed: dict[str, int]) -> None:
    """Add to the audit row's counts, in the caller's (the batch's) transaction."""
    # The row lock orders two continuations of one erasure (an execute and beat's resume).
    job = Erasure.objects.select_for_update().get(id=erasure_id)
    for name, n in removed.items():
        job.counts[name] = int(job.counts.get(name, 0)) + n
    job.save(update_fields=["counts", "updated_at"])


def _rows_plane(erasure_id: str, tenant: str, user: str, name: str, batch: Batch) -> None:
    limit = settings.LOOMCYCLE.erasure_batch
    while True:
        with transaction.atomic():
            n = batch(tenant, user, limit)
            if n:
                _count(erasure_id, {name: n})
        if n < limit:
            return


def _runs_plane(erasure_id: str, tenant: str, user: str) -> bool:
    """Delete the person's run trees, each with its audit count in one transaction; True when
    none is left. Live trees are cancelled and left for a later continuation."""
    for root_id in runs.live_roots_of_user(tenant_id=tenant, user_id=user, limit=1000):
        cancel.run_stop(run_id=root_id, reason="erasure of its user")
    kept: set[str] = set()
    limit = settings.LOOMCYCLE.erasure_batch
    while True:
        roots = [r for r in runs.user_roots(tenant_id=tenant, user_id=user, limit=limit + len(kept)) if r not in kept]
        for root_id in roots:
            with transaction.atomic():
                one = deletion.tree_delete(root_id=root_id)
                if one.live:
                    kept.add(root_id)
                else:
                    _count(erasure_id, {"runs.Run": one.deleted_runs, **one.counts})
        if not roots:
            return not kept


def erasure_continue(*, erasure_id: str) -> Erasure:
    """Run (or resume) an erasure until every plane is empty, or until only live runs are left."""
    job = Erasure.objects.get(id=erasure_id)
    if job.status == ErasureStatus.DONE:
        return job
    tenant, user = job.tenant_id, job.user_id
    runs_done = _runs_plane(job.id, tenant, user)
    _rows_plane(job.id, tenant, user, "memory.MemoryEntry", _memory)
    _rows_plane(job.id, tenant, user, "channels.ChannelMessage+ChannelCursor", _channels)
    _rows_plane(job.id, tenant, user, "gateway.UsageEntry+GatewayCall(anonymised)", _ledger)
    if runs_done:
        Erasure.objects.filter(id=job.id, status=ErasureStatus.RUNNING).update(
            status=ErasureStatus.DONE, finished_at=timezone.now()
        )
    return Erasure.objects.get(id=job.id)


def _memory(tenant: str, user: str, limit: int) -> int:
    return memory.memory_user_erase_batch(tenant_id=tenant, user_id=user, limit=limit)


def _channels(tenant: str, user: str, limit: int) -> int:
    return channels.channels_user_erase_batch(tenant_id=tenant, user_id=user, limit=limit)


def _ledger(tenant: str, user: str, limit: int) -> int:
    return ledger.usage_user_anonymise_batch(tenant_id=tenant, user_id=user, limit=limit)


def erasures_resume() -> int:
    """Beat: continue every erasure still running (a crashed execute, live runs that since ended)."""
    ids = list(Erasure.objects.filter(status=ErasureStatus.RUNNING).values_list("id", flat=True)[:100])
    for erasure_id in ids:
        erasure_continue(erasure_id=erasure_id)
    return len(ids)


def erasure_body(job: Erasure) -> dict[str, Any]:
    return {
        "erasure_id": job.id,
        "tenant": job.tenant_id,
        "subject": job.user_id,
        "dry_run": False,
        "status": job.status,
        "deleted": dict(job.counts),
        "retained": dict(RETAINED),
        "residue": {"rows": 0, "scopes": [], "sessions_examined": 0, "truncated": False},
        "started_at": job.started_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "errors": [],
        "notes": list(NOTES)
        + (
            []
            if job.status == ErasureStatus.DONE
            else ["live runs are being cancelled; the erasure resumes when they end"]
        ),
    }
