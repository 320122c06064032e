"""Evaluation reads (SPEC 6.6): get, list, aggregate. The tenant is always an
explicit keyword; another tenant's evaluation is absent."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Avg, Count, Max, Min, QuerySet

from apps.evaluations.models import Evaluation


@dataclass(frozen=True)
class Aggregate:
    count: int
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    latest: float | None
    by_emitter_role: dict[str, dict[str, float | int]] = field(default_factory=dict)


def evaluation_get(*, tenant_id: str, eval_id: str) -> Evaluation | None:
    return Evaluation.objects.filter(tenant_id=tenant_id, eval_id=eval_id).first()


def _matching(
    *, tenant_id: str, run_id: str | None, def_id: str | None, agent_name: str | None
) -> QuerySet[Evaluation]:
    rows = Evaluation.objects.filter(tenant_id=tenant_id)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    if def_id is not None:
        rows = rows.filter(def_id=def_id)
    if agent_name is not None:
        rows = rows.filter(agent_name=agent_name)
    return rows


def evaluation_list(
    *, tenant_id: str, run_id: str | None = None, def_id: str | None = None, limit: int = 100
) -> tuple[list[Evaluation], bool]:
    """Newest first, at most `limit`; the flag says more matched."""
    rows = _matching(tenant_id=tenant_id, run_id=run_id, def_id=def_id, agent_name=None)
    found = list(rows.order_by("-created_at", "eval_id")[: limit + 1])
    return found[:limit], len(found) > limit


def evaluation_aggregate(*, tenant_id: str, def_id: str | None = None, agent_name: str | None = None) -> Aggregate:
    """Score statistics over the tenant's evaluations of `def_id` and/or `agent_name` (all when neither)."""
    rows = _matching(tenant_id=tenant_id, run_id=None, def_id=def_id, agent_name=agent_name)
    stats = rows.aggregate(count=Count("eval_id"), mean=Avg("score"), min=Min("score"), max=Max("score"))
    count = int(stats["count"])
    if count == 0:
        return Aggregate(0, None, None, None, None, None)
    # Median in Python over the scores only: one float column, bounded by the filtered set.
    scores = sorted(rows.values_list("score", flat=True))
    mid = count // 2
    median = scores[mid] if count % 2 else (scores[mid - 1] + scores[mid]) / 2
    latest = rows.order_by("-created_at", "-eval_id").values_list("score", flat=True).first()
    by_role = {
        str(r["emitter_role"]): {"count": int(r["count"]), "mean": float(r["mean"])}
        for r in rows.order_by().values("emitter_role").annotate(count=Count("eval_id"), mean=Avg("score"))
    }
    return Aggregate(count, float(stats["mean"]), median, stats["min"], stats["max"], latest, by_role)
