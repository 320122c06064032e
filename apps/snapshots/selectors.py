"""Reads of stored snapshots (admin only: a snapshot spans every tenant)."""

from __future__ import annotations

from apps.snapshots.errors import SnapshotNotFound
from apps.snapshots.models import Snapshot

LIST_LIMIT_MAX = 1000


def snapshot_list(*, limit: int = 100, label_contains: str = "") -> list[Snapshot]:
    """Newest first, without their content."""
    rows = Snapshot.objects.defer("content")
    if label_contains:
        rows = rows.filter(label__contains=label_contains)
    return list(rows.order_by("-created_at", "id")[: max(1, min(limit, LIST_LIMIT_MAX))])


def snapshot_get(*, snapshot_id: str) -> Snapshot:
    """One snapshot with its content; 404 `snapshot_not_found`."""
    row = Snapshot.objects.filter(id=snapshot_id).first()
    if row is None:
        raise SnapshotNotFound(f"snapshot {snapshot_id} not found")
    return row


def snapshot_content(*, snapshot_id: str) -> str:
    """The envelope text exactly as stored."""
    return snapshot_get(snapshot_id=snapshot_id).content
