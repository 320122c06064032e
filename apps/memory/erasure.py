"""Memory's part in a person's erasure (apps.lifecycle.erasure calls these): the rows of their
`user` scope (scope_id = their user id), read through the unique index led by
(tenant, scope, scope_id). Bounded: at most `limit` rows per call, in the caller's
transaction. Facts about them in agent or tenant scopes are not theirs by key and are not
reached (docs/operations.md, "Data lifecycle")."""

from __future__ import annotations

from apps.memory.models import MemoryEntry, MemoryScope


def memory_user_count(*, tenant_id: str, user_id: str) -> dict[str, int]:
    qs = MemoryEntry.objects.filter(tenant_id=tenant_id, scope=MemoryScope.USER, scope_id=user_id)
    return {"memory.MemoryEntry": qs.count()}


def memory_user_erase_batch(*, tenant_id: str, user_id: str, limit: int) -> int:
    """Delete up to `limit` of the person's memory rows; rows deleted (0: none left)."""
    qs = MemoryEntry.objects.filter(tenant_id=tenant_id, scope=MemoryScope.USER, scope_id=user_id)
    ids = list(qs.values_list("pk", flat=True)[:limit])
    deleted, _ = MemoryEntry.objects.filter(pk__in=ids).delete()
    return deleted
