"""Evaluation reads (SPEC 6.6): get, list, aggregate. The tenant is always an
explicit keyword; another tenant's evaluation is absent."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from django.db.models import QuerySet

from apps.evaluations.models import Evaluation
from apps.substrate.selectors import agent_def_ancestors


@dataclass(frozen=True)
class Stats:
    """SPEC 6.6's score statistics; all zero when `count` is 0 (no scores yet is not an error)."""

    mean: float = 0.0
    median: float = 0.0
    min: float = 0.0
    max: float = 0.0
    latest: float = 0.0
    count: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class Aggregate:
    count: int
    score: Stats
    dimensions: dict[str, Stats] = field(default_factory=dict)
    by_emitter_role: dict[str, Stats] = field(default_factory=dict)
    lineage_included: bool = False


def stats_of(values: list[float]) -> Stats:
    """Statistics of `values`, oldest first (the last one is `latest`)."""
    if not values:
        return Stats()
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    mean = sum(values) / len(values)
    return Stats(mean, median, ordered[0], ordered[-1], values[-1], len(values))


def evaluation_get(*, tenant_id: str, eval_id: str) -> Evaluation | None:
    return Evaluation.objects.filter(tenant_id=tenant_id, eval_id=eval_id).first()


def _matching(
    *, tenant_id: str, run_id: str | None, def_id: str | list[str] | None, agent_name: str | None
) -> QuerySet[Evaluation]:
    rows = Evaluation.objects.filter(tenant_id=tenant_id)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    if isinstance(def_id, list):
        rows = rows.filter(def_id__in=def_id)
    elif def_id is not None:
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


def evaluation_aggregate(
    *, tenant_id: str, def_id: str | None = None, agent_name: str | None = None, include_lineage: bool = False
) -> Aggregate:
    """Score statistics over the tenant's evaluations of `def_id` (and, with `include_lineage`, of
    its ancestor versions) and/or `agent_name` (all when neither); per dimension and per emitter role too."""
    def_ids: str | list[str] | None = def_id
    if include_lineage and def_id is not None:
        def_ids = [def_id, *agent_def_ancestors(def_id=def_id)]
    rows = _matching(tenant_id=tenant_id, run_id=None, def_id=def_ids, agent_name=agent_name)
    # Oldest first, so each axis's last value is its latest; the set is the filtered scores only.
    found = list(rows.order_by("created_at", "eval_id").values_list("score", "dimensions", "emitter_role"))
    axes: dict[str, list[float]] = {}
    roles: dict[str, list[float]] = {}
    for score, dimensions, role in found:
        for axis, value in (dimensions or {}).items():
            axes.setdefault(axis, []).append(float(value))
        roles.setdefault(role, []).append(score)
    return Aggregate(
        count=len(found),
        score=stats_of([score for score, _, _ in found]),
        dimensions={axis: stats_of(values) for axis, values in axes.items()},
        by_emitter_role={role: stats_of(values) for role, values in roles.items()},
        lineage_included=include_lineage,
    )
