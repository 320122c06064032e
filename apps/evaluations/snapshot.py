"""Evaluations' part of a snapshot (apps.snapshots, SPEC 4.6 `evaluations`):
every score of every tenant. Rows are immutable (a trigger refuses UPDATE),
so a restore is insert-or-ignore by `eval_id`."""

from __future__ import annotations

from typing import Any

from apps.core.errors import Invalid
from apps.core.rows import row_dump, rows_insert_or_ignore
from apps.evaluations.models import Evaluation


def evaluations_export() -> list[dict[str, Any]]:
    return [row_dump(row) for row in Evaluation.objects.order_by("created_at", "eval_id").iterator()]


def evaluations_restore(rows: list[Any]) -> int:
    """Inside the restore's transaction: the rows written (known eval_ids skipped)."""
    if not all(isinstance(r, dict) for r in rows):
        raise Invalid("an evaluations row is not an object", code="snapshot_invalid")
    return rows_insert_or_ignore(Evaluation, rows)
