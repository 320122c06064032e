"""Snapshot rows as the API shows them (SPEC 2.4, Appendix E: `created_at` with milliseconds)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from apps.snapshots.envelope import canonical
from apps.snapshots.models import Snapshot
from apps.snapshots.services import Capture


def snapshot_out(row: Snapshot) -> dict[str, Any]:
    created = row.created_at.astimezone(UTC)
    return {
        "id": row.id,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{created.microsecond // 1000:03d}Z",
        "label": row.label,
        "schema_version": row.schema_version,
        "byte_size": row.byte_size,
    }


def snapshot_captured_out(capture: Capture) -> dict[str, Any]:
    """The capture's 201 body: the row, and what it carries of the live runs (a capture of a running
    runtime carries none: pause first to move runs with their state)."""
    return {
        **snapshot_out(capture.row),
        "runtime_state": capture.runtime_state,
        "runs_captured": capture.runs_captured,
        "runs_left_out": capture.runs_left_out,
    }


def snapshot_with_envelope(row: Snapshot) -> str:
    """Metadata plus `envelope`, the stored text spliced in as is (never parsed and re-serialised)."""
    return canonical(snapshot_out(row))[:-1] + ',"envelope":' + row.content + "}"
