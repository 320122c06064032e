"""Snapshot rows as the API shows them (SPEC 2.4, Appendix E: `created_at` with milliseconds)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from apps.snapshots.envelope import canonical
from apps.snapshots.models import Snapshot


def snapshot_out(row: Snapshot) -> dict[str, Any]:
    created = row.created_at.astimezone(UTC)
    return {
        "id": row.id,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{created.microsecond // 1000:03d}Z",
        "label": row.label,
        "schema_version": row.schema_version,
        "byte_size": row.byte_size,
    }


def snapshot_with_envelope(row: Snapshot) -> str:
    """Metadata plus `envelope`, the stored text spliced in as is (never parsed and re-serialised)."""
    return canonical(snapshot_out(row))[:-1] + ',"envelope":' + row.content + "}"
