"""Evaluations of deleted runs go with them (apps.runs.deletion, registered at ready()):
an evaluation's judgement and rationale are about the run's content. The table refuses
UPDATE, never DELETE (docs/evaluation.md)."""

from __future__ import annotations

from apps.evaluations.models import Evaluation


def evaluations_of_runs_delete(tenant_id: str, run_ids: list[str]) -> dict[str, int]:
    """Delete the evaluations of these runs (index `evaluation_run`, led by tenant and run)."""
    deleted, _ = Evaluation.objects.filter(tenant_id=tenant_id, run_id__in=run_ids).delete()
    return {"evaluations.Evaluation": deleted} if deleted else {}
