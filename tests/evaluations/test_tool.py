"""The `Evaluation` tool in real runs (mock provider, real workers, real
Postgres): submit, get, list, aggregate; default-deny scopes; tenant
isolation of the evaluated run; byte caps; immutable rows."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import DatabaseError, transaction

from apps.evaluations import services
from apps.evaluations.models import Evaluation
from apps.runs.models import Run, RunEvent, RunStatus
from apps.substrate.models import AgentDef
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents")


def _agent(http: httpx.Client, name: str, tool_input: dict[str, Any], scopes: list[str]) -> None:
    model = "mock-tool-loop?tool=Evaluation&calls=1&latency_ms=0&input=" + quote(json.dumps(tool_input))
    overlay = {"provider": "mock", "model": model, "tools": ["Evaluation"], "evaluation_scopes": scopes}
    resp = http.post("/v1/_agentdef", json={"op": "create", "name": name, "overlay": overlay})
    assert resp.status_code == 200, resp.text


def _start(http: httpx.Client, agent: str) -> str:
    run = http.post("/v1/runs", json={"agent": agent, "prompt": "go", "background": True}).json()
    wait_status(run["run_id"], RunStatus.COMPLETED)
    return str(run["run_id"])


def _tool(http: httpx.Client, name: str, tool_input: dict[str, Any], scopes: list[str]) -> dict[str, Any]:
    """Create an agent that calls Evaluation once with `tool_input`, run it, return the tool_result payload."""
    _agent(http, name, tool_input, scopes)
    payload: dict[str, Any] = RunEvent.objects.get(run_id=_start(http, name), type="tool_result").payload
    return payload


def _ok(result: dict[str, Any]) -> Any:
    assert result["is_error"] is False, result
    return json.loads(result["text"])


def _refused(result: dict[str, Any], needle: str) -> None:
    assert result["is_error"] is True and needle in result["text"], result


def test_submit_then_get_list_aggregate(http: httpx.Client, stack: Any) -> None:
    target_id = _start(http, "echo")
    target = Run.objects.get(id=target_id)
    first = _ok(
        _tool(
            http,
            "ev-a",
            {"op": "submit", "run_id": target_id, "score": 0.75, "judgement": "good", "rationale": "terse and right"},
            ["submit_any"],
        )
    )
    assert re.fullmatch(r"eval_[0-9a-f]{16}", first["eval_id"]) and first["score"] == 0.75
    assert (first["run_id"], first["def_id"], first["agent"]) == (target_id, target.agent_def_id, "echo")
    assert first["emitter_role"] == "unrelated" and first["created_at"].endswith("Z")
    second_input = {"op": "submit", "run_id": target_id, "score": 0.25, "dimensions": {"speed": 0.5}}
    second = _ok(_tool(http, "ev-b", second_input, ["submit_any"]))

    got = _ok(_tool(http, "ev-get", {"op": "get", "eval_id": first["eval_id"]}, ["read_any"]))
    assert (got["judgement"], got["rationale"], got["evaluator_agent"]) == ("good", "terse and right", "ev-a")
    assert got["dimensions"] == {} and Evaluation.objects.get(eval_id=second["eval_id"]).dimensions == {"speed": 0.5}
    row = Evaluation.objects.get(eval_id=first["eval_id"])
    assert row.evaluator_run_id == got["evaluator_run_id"] and row.tenant_id == ""

    listed = _ok(_tool(http, "ev-list", {"op": "list", "run_id": target_id, "limit": 1}, ["read_any"]))
    assert [e["eval_id"] for e in listed["evaluations"]] == [second["eval_id"]] and listed["truncated"] is True
    by_def = _ok(_tool(http, "ev-list-def", {"op": "list_for_def", "def_id": target.agent_def_id}, ["read_any"]))
    assert {e["eval_id"] for e in by_def["evaluations"]} == {first["eval_id"], second["eval_id"]}

    agg = _ok(_tool(http, "ev-agg", {"op": "aggregate", "def_id": target.agent_def_id}, ["read_any"]))
    both = {"mean": 0.5, "median": 0.5, "min": 0.25, "max": 0.75, "latest": 0.25, "count": 2}
    assert agg == {
        "def_id": target.agent_def_id,
        "agent": None,
        "count": 2,
        "score": both,
        "dimensions": {"speed": {"mean": 0.5, "median": 0.5, "min": 0.5, "max": 0.5, "latest": 0.5, "count": 1}},
        "by_emitter_role": {"unrelated": both},
        "lineage_included": False,
    }
    none = _ok(_tool(http, "ev-agg-none", {"op": "aggregate", "agent": "nobody"}, ["read_any"]))
    zero = {"mean": 0.0, "median": 0.0, "min": 0.0, "max": 0.0, "latest": 0.0, "count": 0}
    assert (none["count"], none["score"], none["dimensions"], none["by_emitter_role"]) == (0, zero, {}, {})


def test_aggregate_with_lineage_adds_the_ancestor_versions(http: httpx.Client, stack: Any) -> None:
    target = Run.objects.get(id=_start(http, "echo"))
    fork = http.post("/v1/_agentdef", json={"op": "fork", "name": "echo", "overlay": {"description": "v2"}})
    assert fork.status_code == 200, fork.text
    child_def = fork.json()["def_id"]
    assert AgentDef.objects.get(id=child_def).parent_id == target.agent_def_id
    external = {"tenant_id": "", "evaluator": services.Evaluator(), "role": "external"}
    services.evaluation_submit(target=target, score=0.2, **external)  # scores the parent version
    target.agent_def_id = child_def  # the same run read as one of the fork (in memory only)
    services.evaluation_submit(target=target, score=0.8, dimensions={"tone": 1}, **external)
    alone = _ok(_tool(http, "ev-agg-child", {"op": "aggregate", "def_id": child_def}, ["read_any"]))
    assert (alone["count"], alone["score"]["mean"], alone["lineage_included"]) == (1, 0.8, False)
    tree = {"op": "aggregate", "def_id": child_def, "include_lineage": True}
    lineage = _ok(_tool(http, "ev-agg-tree", tree, ["read_any"]))
    assert (lineage["count"], lineage["score"]["mean"], lineage["score"]["latest"]) == (2, 0.5, 0.8)
    assert lineage["lineage_included"] is True and lineage["dimensions"]["tone"]["count"] == 1
    _refused(_tool(http, "ev-agg-nodef", {"op": "aggregate", "include_lineage": True}, ["read_any"]), "needs def_id")


@pytest.mark.parametrize(
    ("tool_input", "scopes", "needle"),
    [
        ({"op": "submit", "score": 0.5}, [], "evaluation is default-deny"),
        ({"op": "submit", "score": 0.5}, ["read_any"], "needs evaluation_scopes submit_any (granted: read_any)"),
        ({"op": "submit", "score": 0.5}, ["submit_self", "submit_descendants"], "as 'unrelated'"),
        ({"op": "list"}, ["submit_any"], "list needs evaluation_scopes read_any"),
        ({"op": "aggregate"}, [], "aggregate needs evaluation_scopes read_any"),
    ],
)
def test_scopes_are_default_deny(
    http: httpx.Client, stack: Any, tool_input: dict[str, Any], scopes: list[str], needle: str
) -> None:
    if tool_input["op"] == "submit":
        tool_input = {**tool_input, "run_id": _start(http, "echo")}
    _refused(_tool(http, "ev-refused", tool_input, scopes), needle)
    assert Evaluation.objects.count() == 0


def test_unknown_and_other_tenant_runs_read_the_same(http: httpx.Client, stack: Any) -> None:
    foreign = _start(http, "echo")
    Run.objects.filter(id=foreign).update(tenant_id="beta")  # the run now belongs to another tenant
    for name, run_id in (("ev-foreign", foreign), ("ev-missing", "r_0000000000000000")):
        result = _tool(http, name, {"op": "submit", "run_id": run_id, "score": 0.5}, ["submit_any"])
        assert result == {**result, "is_error": True, "text": f"run_not_found: run {run_id!r} not found"}
    assert Evaluation.objects.count() == 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"score": 1.5}, "invalid_score: score must be between 0 and 1"),
        ({"score": "high"}, "invalid_score: score must be a number"),
        ({"judgement": {"ok": True}}, "judgement must be a string"),
        ({"dimensions": {"speed": "fast"}}, "invalid_dimensions: dimension 'speed' must be a finite number"),
        ({"dimensions": [0.5]}, "invalid_dimensions: dimensions must be an object"),
    ],
)
def test_submit_refuses_bad_values(http: httpx.Client, stack: Any, extra: dict[str, Any], needle: str) -> None:
    tool_input = {"op": "submit", "run_id": _start(http, "echo"), "score": 0.5, **extra}
    _refused(_tool(http, "ev-limits", tool_input, ["submit_any"]), needle)
    assert Evaluation.objects.count() == 0


# The byte caps go through the service: inputs this large do not fit the mock's scripted model string.
@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("judgement", "é" * 2049, "judgement is 4098 bytes, over the 4096-byte limit"),
        ("rationale", "x" * 16_385, "rationale is 16385 bytes, over the 16384-byte limit"),
    ],
)
def test_text_over_its_byte_cap_is_refused(http: httpx.Client, stack: Any, field: str, text: str, message: str) -> None:
    target = Run.objects.get(id=_start(http, "echo"))
    with pytest.raises(services.EvaluationFieldTooLarge, match=message):
        services.evaluation_submit(
            tenant_id="", target=target, score=0.5, evaluator=services.Evaluator(), role="external", **{field: text}
        )
    at_cap = services.evaluation_submit(
        tenant_id="", target=target, score=0.5, evaluator=services.Evaluator(), role="external", **{field: text[:-1]}
    )
    assert len(getattr(at_cap, field).encode()) <= (4096 if field == "judgement" else 16_384)
    assert Evaluation.objects.count() == 1


def test_evaluations_are_immutable(http: httpx.Client, stack: Any) -> None:
    target_id = _start(http, "echo")
    made = _ok(_tool(http, "ev-once", {"op": "submit", "run_id": target_id, "score": 0.9}, ["submit_any"]))
    _refused(
        _tool(http, "ev-update", {"op": "update", "eval_id": made["eval_id"], "score": 0.1}, ["submit_any"]),
        "unknown op 'update'",
    )
    with pytest.raises(DatabaseError, match="is immutable"), transaction.atomic():
        Evaluation.objects.filter(eval_id=made["eval_id"]).update(score=0.1)
    assert Evaluation.objects.get(eval_id=made["eval_id"]).score == 0.9
