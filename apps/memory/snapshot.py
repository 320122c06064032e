"""Memory's part of a snapshot (apps.snapshots, SPEC 4.6 `memory`): every
entry of every tenant, expired ones included (they stay invisible wherever
they land), with its embedding as base64 of little-endian float32s as SPEC
says. A restore is insert-or-ignore per (tenant, scope, scope_id, key): a key
this instance already holds keeps its own value."""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

from apps.core.errors import Invalid
from apps.core.rows import row_dump, rows_insert_or_ignore
from apps.memory.models import EMBEDDING_DIMENSIONS, MemoryEntry


def _pack(vector: list[float] | None) -> str | None:
    if vector is None:
        return None
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _unpack(text: Any) -> list[float] | None:
    """The vector of a base64 embedding; refuses anything but EMBEDDING_DIMENSIONS float32s."""
    if text is None:
        return None
    try:
        raw = base64.b64decode(str(text), validate=True)
    except binascii.Error as exc:
        raise Invalid("memory embedding is not base64", code="snapshot_invalid") from exc
    if len(raw) != 4 * EMBEDDING_DIMENSIONS:
        raise Invalid(f"memory embedding must hold {EMBEDDING_DIMENSIONS} float32s", code="snapshot_invalid")
    return list(struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", raw))


def memory_export() -> list[dict[str, Any]]:
    """Every memory row, without its instance-local primary key."""
    out = []
    for entry in MemoryEntry.objects.order_by("tenant_id", "scope", "scope_id", "key").iterator():
        row = row_dump(entry, exclude=("id",))
        row["embedding"] = _pack(row["embedding"])
        out.append(row)
    return out


def memory_restore(rows: list[Any]) -> int:
    """Inside the restore's transaction: the rows written (existing keys skipped)."""
    decoded = []
    for row in rows:
        if not isinstance(row, dict):
            raise Invalid("a memory row is not an object", code="snapshot_invalid")
        decoded.append({**row, "embedding": _unpack(row.get("embedding"))})
    return rows_insert_or_ignore(MemoryEntry, decoded)
