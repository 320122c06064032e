"""Evaluations' part of a snapshot (apps.snapshots, SPEC 4.6 `evaluations`):
every score of every tenant. Rows are immutable (a trigger refuses UPDATE),
so a restore is insert-or-ignore by `eval_id`; `def_id` is mapped to this
instance's def as the runs' pins are (apps.substrate.snapshot)."""

from __future__ import annotations

from typing import Any

from apps.core.errors import Invalid
from apps.core.rows import row_dump, rows_insert_or_ignore
from apps.evaluations.models import Evaluation


def evaluations_export() -> list[dict[str, Any]]:
    return [row_dump(row) for row in Evaluation.objects.order_by("created_at", "eval_id").iterator()]


def evaluations_restore(rows: list[Any], *, def_ids: dict[str, str]) -> int:
    """Inside the restore's transaction: the rows written (known eval_ids skipped). Each
    row's `def_id` is mapped through `def_ids` (snapshot def id -> this instance's, from
    the agent-def restore), so a score stays with the def it scored here; an id the map
    lacks is kept as it is (a def deleted before the capture)."""
    if not all(isinstance(r, dict) for r in rows):
        raise Invalid("an evaluations row is not an object", code="snapshot_invalid")
    mapped = [
        {**r, "def_id": def_ids.get(r["def_id"], r["def_id"])} if isinstance(r.get("def_id"), str) else r for r in rows
    ]
    return rows_insert_or_ignore(Evaluation, mapped)
