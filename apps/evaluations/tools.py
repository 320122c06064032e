"""`Evaluation`: score runs (SPEC 6.6), a thin adapter over the evaluation services.

Gating is default-deny by the evaluating agent definition's
`evaluation_scopes`: `submit_any` (any run of the tenant), `submit_self`
(this run), `submit_descendants` (runs this run spawned, at any depth),
`read_any` (get, list, aggregate). `submit_siblings` is reserved: accepted in
a definition, it grants nothing (siblings count as unrelated). The evaluated
run must be in the caller's tenant; another tenant's run id reads as unknown.
Every refusal is an `is_error` result whose text says what to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.core.timefmt import ts
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, op_tool_result
from apps.evaluations import selectors, services
from apps.evaluations.models import EmitterRole, Evaluation
from apps.substrate.selectors import agent_definition

OPS = ("submit", "get", "list", "list_for_run", "list_for_def", "aggregate")
FIELDS = frozenset(
    {"op", "run_id", "eval_id", "def_id", "agent", "score", "dimensions", "judgement", "rationale", "include_lineage"}
    | {"limit"}
)
READ_SCOPE = "read_any"
SUBMIT_SCOPES = {  # emitter role -> the scopes that allow submitting in it
    EmitterRole.SELF: ("submit_any", "submit_self"),
    EmitterRole.PARENT: ("submit_any", "submit_descendants"),
    EmitterRole.UNRELATED: ("submit_any",),
    EmitterRole.EXTERNAL: ("submit_any",),  # no run: the operator plane (the MCP server's `evaluation`)
}
OPERATOR_GRANT = ["submit_any", "read_any"]  # what the operator plane holds in its own tenant


class Refusal(ToolRefusal):
    """A bad call: the message goes back to the model as an is_error result."""


def _granted(ctx: ToolContext) -> list[str]:
    definition = agent_definition(ctx.agent_def_id)
    return [s for s in definition.get("evaluation_scopes") or [] if isinstance(s, str)]


def _need(granted: list[str], allowed: tuple[str, ...], what: str) -> None:
    if not set(allowed) & set(granted):
        have = ", ".join(granted) if granted else "none: evaluation is default-deny"
        raise Refusal(f"{what} needs evaluation_scopes {' or '.join(allowed)} (granted: {have})")


def _str(data: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise Refusal(f"{name} must be a non-empty string")
    return value


def _out(row: Evaluation) -> dict[str, Any]:
    return {
        "eval_id": row.eval_id,
        "run_id": row.run_id,
        "def_id": row.def_id,
        "agent": row.agent_name,
        "emitter_role": row.emitter_role,
        "score": row.score,
        "dimensions": row.dimensions,
        "judgement": row.judgement,
        "rationale": row.rationale,
        "evaluator_run_id": row.evaluator_run_id,
        "evaluator_agent": row.evaluator_agent_name,
        "created_at": ts(row.created_at),
    }


def _submit(ctx: ToolContext, data: dict[str, Any], granted: list[str]) -> dict[str, Any]:
    run_id = str(_str(data, "run_id", required=True))
    if "score" not in data:
        raise Refusal("submit needs a score (a number between 0 and 1)")
    texts = {name: data.get(name, "") for name in ("judgement", "rationale")}
    for name, text in texts.items():
        if not isinstance(text, str):
            raise Refusal(f"{name} must be a string")
    target = services.evaluated_run_get(tenant_id=ctx.tenant_id, run_id=run_id)
    role = services.emitter_role(target=target, evaluator_run_id=ctx.run_id)
    _need(granted, SUBMIT_SCOPES[EmitterRole(role)], f"submitting as {role!r} for run {run_id!r}")
    row = services.evaluation_submit(
        tenant_id=ctx.tenant_id,
        target=target,
        score=data["score"],
        judgement=texts["judgement"],
        rationale=texts["rationale"],
        dimensions=data.get("dimensions"),
        evaluator=services.Evaluator(run_id=ctx.run_id, agent_name=ctx.agent_name),
        role=role,
    )
    keys = ("eval_id", "run_id", "def_id", "agent", "emitter_role", "score", "created_at")
    return {k: v for k, v in _out(row).items() if k in keys}


def _get(ctx: ToolContext, data: dict[str, Any], granted: list[str]) -> dict[str, Any]:
    _need(granted, (READ_SCOPE,), "get")
    eval_id = str(_str(data, "eval_id", required=True))
    row = selectors.evaluation_get(tenant_id=ctx.tenant_id, eval_id=eval_id)
    if row is None:
        raise Refusal(f"evaluation {eval_id!r} not found")
    return _out(row)


def _list(ctx: ToolContext, data: dict[str, Any], granted: list[str]) -> dict[str, Any]:
    _need(granted, (READ_SCOPE,), "list")
    run_id, def_id = _str(data, "run_id"), _str(data, "def_id")
    op = data["op"]
    if (op == "list_for_run" and run_id is None) or (op == "list_for_def" and def_id is None):
        raise Refusal(f"{op} needs {'run_id' if op == 'list_for_run' else 'def_id'}")
    if run_id is not None and def_id is not None:
        raise Refusal("list takes run_id or def_id, not both")
    limit = data.get("limit", 100)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise Refusal(f"limit must be an integer between 1 and 1000 (got {limit!r})")
    rows, truncated = selectors.evaluation_list(tenant_id=ctx.tenant_id, run_id=run_id, def_id=def_id, limit=limit)
    return {"evaluations": [_out(r) for r in rows], "truncated": truncated}


def _aggregate(ctx: ToolContext, data: dict[str, Any], granted: list[str]) -> dict[str, Any]:
    _need(granted, (READ_SCOPE,), "aggregate")
    def_id, agent = _str(data, "def_id"), _str(data, "agent")
    lineage = data.get("include_lineage", False)
    if not isinstance(lineage, bool):
        raise Refusal("include_lineage must be true or false")
    if lineage and def_id is None:
        raise Refusal("include_lineage needs def_id (the version whose ancestors are walked)")
    agg = selectors.evaluation_aggregate(
        tenant_id=ctx.tenant_id, def_id=def_id, agent_name=agent, include_lineage=lineage
    )
    return {
        "def_id": def_id,
        "agent": agent,
        "count": agg.count,
        "score": agg.score.as_dict(),
        "dimensions": {axis: stats.as_dict() for axis, stats in agg.dimensions.items()},
        "by_emitter_role": {role: stats.as_dict() for role, stats in agg.by_emitter_role.items()},
        "lineage_included": agg.lineage_included,
    }


_HANDLERS: dict[str, Callable[[ToolContext, dict[str, Any], list[str]], dict[str, Any]]] = {
    "submit": _submit,
    "get": _get,
    "list": _list,
    "list_for_run": _list,
    "list_for_def": _list,
    "aggregate": _aggregate,
}


def evaluation_ops(ctx: ToolContext, data: dict[str, Any], granted: list[str]) -> ToolResult:
    """The ops with `granted` scopes: the agent's (evaluation_execute), or OPERATOR_GRANT for a
    caller with no run (`ctx.run_id` ""), who submits as `external` and reads its tenant's."""
    return op_tool_result(data, ops=OPS, fields=FIELDS, run=lambda op: _HANDLERS[op](ctx, data, granted))


def evaluation_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    return evaluation_ops(ctx, data, _granted(ctx))


EVALUATION_TOOL = Tool(
    name="Evaluation",
    description="Score runs and read scores. op: submit (run_id, score 0..1, optional judgement and rationale "
    "text, dimensions {axis: number}) -> eval_id; get (eval_id); list (run_id or def_id, limit; list_for_run / "
    "list_for_def also accepted); aggregate (def_id and/or agent, include_lineage to add the def's ancestor "
    "versions) -> count, score {mean, median, min, max, latest, count}, dimensions, by_emitter_role. "
    "Evaluations are immutable. "
    "Allowed ops come from the agent's evaluation_scopes: submit_any, submit_self, submit_descendants, read_any.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(OPS)},
            "run_id": {"type": "string", "description": "submit: the run evaluated; list: filter."},
            "eval_id": {"type": "string"},
            "def_id": {"type": "string", "description": "list / aggregate: the evaluated agent definition."},
            "agent": {"type": "string", "description": "aggregate: the evaluated agent's name."},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "dimensions": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": 'submit: optional named axes, e.g. {"correctness": 0.8}.',
            },
            "include_lineage": {"type": "boolean", "description": "aggregate: also the def's ancestor versions."},
            "judgement": {"type": "string"},
            "rationale": {"type": "string"},
            "limit": {"type": "integer", "description": "list: 1..1000, default 100."},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=evaluation_execute,
)
