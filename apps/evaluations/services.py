"""Evaluation writes (SPEC 6.6, 9.6): submit, and the emitter role it records.

Invariants:
- An evaluation is written once and never changed: there is no update
  service, and a trigger (migration 0001) refuses UPDATE in the database.
- The evaluated run is looked up in the caller's tenant only; another
  tenant's run is the same NotFound as a missing one.
- `def_id` and `agent_name` are copied from the evaluated run at submit
  time, so aggregates never join runs and survive run retention.
- `emitter_role` is derived here from run lineage, never taken from input.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from django.conf import settings

from apps.core.errors import Invalid, NotFound, PayloadTooLarge
from apps.evaluations.models import EmitterRole, Evaluation
from apps.runs import selectors as run_selectors
from apps.runs.models import Run

MAX_LINEAGE_HOPS = 100  # a parent chain longer than this is not walked further
MAX_DIMENSIONS = 32  # axes per evaluation: a score card, not a data dump
MAX_AXIS_CHARS = 64


class EvaluationFieldTooLarge(PayloadTooLarge):
    code = "evaluation_field_too_large"


class InvalidScore(Invalid):
    code = "invalid_score"


class InvalidDimensions(Invalid):
    code = "invalid_dimensions"


class EvaluatedRunNotFound(NotFound):
    code = "run_not_found"


@dataclass(frozen=True)
class Evaluator:
    """Who submits: an agent's run, or nobody (`run_id` "" = external)."""

    run_id: str = ""
    agent_name: str = ""


def new_eval_id() -> str:
    return f"eval_{secrets.token_hex(8)}"  # SPEC 1: eval_<16hex>


def evaluated_run_get(*, tenant_id: str, run_id: str) -> Run:
    """The run to evaluate, in `tenant_id` only; EvaluatedRunNotFound otherwise."""
    try:
        return run_selectors.run_get(tenant_id=tenant_id, run_id=run_id)
    except NotFound as exc:
        raise EvaluatedRunNotFound(f"run {run_id!r} not found") from exc


def emitter_role(*, target: Run, evaluator_run_id: str) -> str:
    """external (no run), self (the same run), parent (an ancestor of the target), else unrelated."""
    if not evaluator_run_id:
        return EmitterRole.EXTERNAL.value
    if evaluator_run_id == target.id:
        return EmitterRole.SELF.value
    parent_id = target.parent_id
    for _ in range(MAX_LINEAGE_HOPS):
        if parent_id is None:
            break
        if parent_id == evaluator_run_id:
            return EmitterRole.PARENT.value
        parent_id = run_selectors.run_parent_id(run_id=parent_id)
    return EmitterRole.UNRELATED.value


def _check_score(score: float) -> float:
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise InvalidScore(f"score must be a number between 0 and 1 (got {score!r})")
    if not 0.0 <= float(score) <= 1.0:
        raise InvalidScore(f"score must be between 0 and 1 (got {score!r})")
    return float(score)


def _check_dimensions(dimensions: object) -> dict[str, float]:
    """{axis: finite number}: at most MAX_DIMENSIONS axes named by 1..MAX_AXIS_CHARS characters."""
    if not isinstance(dimensions, dict):
        raise InvalidDimensions("dimensions must be an object of axis name to number")
    if len(dimensions) > MAX_DIMENSIONS:
        raise InvalidDimensions(f"dimensions has {len(dimensions)} axes, over the limit of {MAX_DIMENSIONS}")
    out: dict[str, float] = {}
    for axis, value in dimensions.items():
        if not isinstance(axis, str) or not 1 <= len(axis) <= MAX_AXIS_CHARS:
            raise InvalidDimensions(f"a dimension name must be 1..{MAX_AXIS_CHARS} characters (got {axis!r})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidDimensions(f"dimension {axis!r} must be a finite number (got {value!r})")
        out[axis] = float(value)
    return out


def _check_size(name: str, text: str, limit: int) -> None:
    size = len(text.encode())
    if size > limit:
        raise EvaluationFieldTooLarge(
            f"{name} is {size} bytes, over the {limit}-byte limit",
            details={"field": name, "size": size, "limit": limit},
        )


def evaluation_submit(
    *,
    tenant_id: str,
    target: Run,
    score: float,
    judgement: str = "",
    rationale: str = "",
    dimensions: object = None,
    evaluator: Evaluator,
    role: str,
) -> Evaluation:
    """Record one evaluation of `target` (already looked up in `tenant_id`). One INSERT: atomic by itself."""
    if target.tenant_id != tenant_id:
        raise EvaluatedRunNotFound(f"run {target.id!r} not found")
    value = _check_score(score)
    axes = _check_dimensions({} if dimensions is None else dimensions)
    _check_size("judgement", judgement, settings.LOOMCYCLE.evaluation_max_judgement_bytes)
    _check_size("rationale", rationale, settings.LOOMCYCLE.evaluation_max_rationale_bytes)
    return Evaluation.objects.create(
        eval_id=new_eval_id(),
        tenant_id=tenant_id,
        run_id=target.id,
        def_id=target.agent_def_id,
        agent_name=target.agent_name,
        score=value,
        dimensions=axes,
        judgement=judgement,
        rationale=rationale,
        emitter_role=role,
        evaluator_run_id=evaluator.run_id,
        evaluator_agent_name=evaluator.agent_name,
    )
