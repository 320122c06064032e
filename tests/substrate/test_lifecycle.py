"""Definition lifecycle (SPEC 5) over REST op-dispatch and through the
agent-facing `AgentDef`/`SkillDef` tools, against a real Daphne and workers."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from apps.runs.models import Run, RunEvent, RunStatus
from apps.substrate.models import AgentDef
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents")

BASE = {"provider": "mock", "model": "mock-generic", "tools": ["Context"], "system_prompt": "v1 prompt"}


def op(http: httpx.Client, kind: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    resp = http.post(f"/v1/_{kind}def", json=body)
    assert resp.status_code == status, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_agentdef_lifecycle_over_rest(http: httpx.Client) -> None:
    v1 = op(http, "agent", {"op": "create", "name": "lc", "overlay": BASE, "description": "first"})
    assert (v1["version"], v1["promoted"], v1["parent_def_id"], v1["source"]) == (1, True, "", "runtime")
    assert re.fullmatch(r"def_[0-9a-f]{16}", v1["def_id"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", v1["content_sha256"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", v1["created_at"])
    assert v1["created_by_agent_id"] == "a_http-admin"

    v2 = op(http, "agent", {"op": "fork", "name": "lc", "overlay": {"system_prompt": "v2 prompt"}, "description": "b"})
    assert (v2["version"], v2["promoted"], v2["parent_def_id"]) == (2, False, v1["def_id"])
    assert v2["definition"]["system_prompt"] == "v2 prompt" and v2["definition"]["tools"] == ["Context"]
    assert v2["content_sha256"] != v1["content_sha256"]

    assert op(http, "agent", {"op": "promote", "def_id": v1["def_id"]}) == {
        "def_id": v1["def_id"],
        "name": "lc",
        "promoted": True,
    }
    assert op(http, "agent", {"op": "retire", "def_id": v2["def_id"], "retired": True}) == {
        "def_id": v2["def_id"],
        "retired": True,
    }
    listed = op(http, "agent", {"op": "list", "name": "lc"})
    assert [(v["version"], v["retired"], v["promoted"]) for v in listed["versions"]] == [
        (2, True, False),
        (1, False, True),
    ]

    got = op(http, "agent", {"op": "get", "def_id": v2["def_id"]})
    assert got["retired"] is True and got["parent_def_id"] == v1["def_id"]

    ok = op(http, "agent", {"op": "verify", "name": "lc", "content_sha256": v1["content_sha256"]})
    assert ok == {
        "matches": True,
        "current_sha256": v1["content_sha256"],
        "current_def_id": v1["def_id"],
        "version": 1,
        "name": "lc",
        "deployed": True,
    }
    stale = op(http, "agent", {"op": "verify", "name": "lc", "content_sha256": v2["content_sha256"]})
    assert stale["matches"] is False and stale["current_def_id"] == v1["def_id"]
    missing = op(http, "agent", {"op": "verify", "name": "nobody", "content_sha256": "sha256:00"})
    assert (missing["deployed"], missing["matches"], missing["version"]) == (False, False, 0)

    names = http.get("/v1/_agentdef/names").json()["names"]
    entry = next(n for n in names if n["name"] == "lc")
    assert entry | {"last_updated": None} == {
        "name": "lc",
        "tenant_id": "",
        "version_count": 2,
        "active_def_id": v1["def_id"],
        "latest_version": 2,
        "last_updated": None,
        "live_version_count": 1,
        "active_retired": False,
        "static": False,
    }
    assert any(n["name"] == "echo" and n["static"] for n in names)


def test_fork_overlay_null_removes_a_field(http: httpx.Client) -> None:
    op(http, "agent", {"op": "create", "name": "nulls", "overlay": {**BASE, "max_tokens": 512}})
    fork = op(http, "agent", {"op": "fork", "name": "nulls", "overlay": {"max_tokens": None}})
    assert "max_tokens" not in fork["definition"] and fork["definition"]["system_prompt"] == "v1 prompt"


def test_create_is_idempotent_on_identical_content(http: httpx.Client) -> None:
    first = op(http, "agent", {"op": "create", "name": "idem", "overlay": BASE})
    again = op(http, "agent", {"op": "create", "name": "idem", "overlay": dict(reversed(list(BASE.items())))})
    assert again["def_id"] == first["def_id"] and again["deduplicated"] is True
    changed = op(http, "agent", {"op": "create", "name": "idem", "overlay": {**BASE, "max_iterations": 4}})
    assert changed["version"] == 2 and "deduplicated" not in changed
    assert AgentDef.objects.filter(name="idem").count() == 2


def test_fork_may_narrow_but_never_widen_tools(http: httpx.Client) -> None:
    op(http, "agent", {"op": "create", "name": "narrow", "overlay": {**BASE, "tools": ["Context", "Agent"]}})
    narrowed = op(http, "agent", {"op": "fork", "name": "narrow", "overlay": {"tools": ["Context"]}})
    assert narrowed["definition"]["tools"] == ["Context"]
    # Widening is measured against the lineage root (v1), not the parent:
    back = op(
        http,
        "agent",
        {
            "op": "fork",
            "name": "narrow",
            "parent_def_id": narrowed["def_id"],
            "overlay": {"tools": ["Context", "Agent"]},
        },
    )
    assert back["version"] == 3
    refused = op(http, "agent", {"op": "fork", "name": "narrow", "overlay": {"tools": ["Context", "Grep"]}}, 422)
    assert refused["code"] == "tool_refused" and refused["tool"] == "AgentDef"
    assert "'Grep'" in refused["error"] and "cannot widen" in refused["error"]
    assert AgentDef.objects.filter(name="narrow").count() == 3


def test_static_yaml_names_are_immutable_and_fork_from_the_yaml_entry(http: httpx.Client) -> None:
    refused = op(http, "agent", {"op": "create", "name": "echo", "overlay": BASE}, 422)
    assert "static yaml entry" in refused["error"] and "fork" in refused["error"]
    static = AgentDef.objects.get(name="echo", tenant_id="", source="yaml")
    forked = op(http, "agent", {"op": "fork", "name": "echo", "overlay": {"system_prompt": "louder"}})
    assert forked["parent_def_id"] == static.id and forked["version"] == static.version + 1
    widen = op(http, "agent", {"op": "fork", "name": "echo", "overlay": {"tools": ["Context"]}}, 422)
    assert "cannot widen" in widen["error"]  # the yaml entry has no tools: nothing may be added
    retire = op(http, "agent", {"op": "retire", "def_id": static.id, "retired": True}, 422)
    assert "static yaml entry" in retire["error"]
    # In the shared tenant a promoted fork does not shadow the yaml agent for top-level runs.
    op(http, "agent", {"op": "promote", "def_id": forked["def_id"]})
    run = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True}).json()
    assert Run.objects.get(id=run["run_id"]).agent_def_id == static.id


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"op": "create", "overlay": BASE}, "missing required field: name"),
        ({"op": "create", "name": "../x", "overlay": BASE}, "segment"),
        ({"op": "create", "name": "x", "overlay": {"model": "m"}}, "a pin needs both provider and model"),
        ({"op": "create", "name": "x", "overlay": {**BASE, "frobnicate": 1}}, "unknown field(s) frobnicate"),
        ({"op": "create", "name": "x", "overlay": "nope"}, "overlay must be a JSON object"),
        ({"op": "create", "name": "x", "overlay": BASE, "promote": "yes"}, "promote must be true or false"),
        ({"op": "fork", "name": "no-such-agent"}, "no parent"),
        ({"op": "explode", "name": "x"}, "unknown op 'explode'"),
    ],
)
def test_bad_ops_are_422_tool_refused(http: httpx.Client, body: dict[str, Any], needle: str) -> None:
    out = op(http, "agent", body, 422)
    assert out["code"] == "tool_refused" and needle in out["error"], out


@pytest.mark.parametrize("verb", ["get", "retire", "promote"])
def test_unknown_def_ids_are_404(http: httpx.Client, verb: str) -> None:
    out = op(http, "agent", {"op": verb, "def_id": "def_0000000000000000", "retired": True}, 404)
    assert (out["code"], out["tool"]) == ("not_found", "AgentDef") and "not found" in out["error"]


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"content": b"{not json"}, 400, "invalid_json"),
        ({"content": b""}, 400, "invalid_body"),
        ({"json": {"name": "x"}}, 400, "invalid_body"),
        ({"json": [1, 2]}, 400, "invalid_body"),
        ({"content": b"{}", "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type"),
        ({"content": b'{"op":"list","name":"' + b"x" * (1 << 20) + b'"}'}, 413, "payload_too_large"),
    ],
)
def test_bad_bodies_are_clear_4xx(http: httpx.Client, kwargs: dict[str, Any], status: int, code: str) -> None:
    resp = http.post("/v1/_agentdef", **kwargs)
    assert resp.status_code == status and resp.json()["code"] == code, resp.text


def test_skilldef_lifecycle_and_hash(http: httpx.Client) -> None:
    v1 = op(http, "skill", {"op": "create", "name": "summarise", "overlay": {"body": "Summarise.\r\n  ", "tools": []}})
    assert v1["definition"]["body"] == "Summarise." and v1["content_sha256"].startswith("sha256:")
    v2 = op(http, "skill", {"op": "fork", "name": "summarise", "overlay": {"body": "Summarise briefly."}})
    assert (v2["version"], v2["promoted"]) == (2, False)
    empty = op(http, "skill", {"op": "create", "name": "blank", "overlay": {"body": "  "}}, 422)
    assert "body is required" in empty["error"]
    verify = op(http, "skill", {"op": "verify", "name": "summarise", "content_sha256": v1["content_sha256"]})
    assert verify["matches"] is True


def test_runs_pin_the_resolved_version_and_say_so(http: httpx.Client, stack: Any) -> None:
    v1 = op(http, "agent", {"op": "create", "name": "pinned", "overlay": BASE})
    run1 = http.post("/v1/runs", json={"agent": "pinned", "prompt": "a", "background": True}).json()
    v2 = op(http, "agent", {"op": "fork", "name": "pinned", "overlay": {"system_prompt": "v2"}, "promote": True})
    run2 = http.post("/v1/runs", json={"agent": "pinned", "prompt": "b", "background": True}).json()
    for run, row in ((run1, v1), (run2, v2)):
        done = wait_status(run["run_id"], RunStatus.COMPLETED)
        assert (done.agent_def_id, done.agent_def_sha256) == (row["def_id"], row["content_sha256"])
        first = RunEvent.objects.get(run_id=run["run_id"], type="user_input").payload
        assert (first["agent_def_id"], first["agent_def_version"]) == (row["def_id"], row["version"])
        agent = http.get(f"/v1/runs/{run['run_id']}").json()
        assert (agent["agent_def_id"], agent["content_sha256"]) == (row["def_id"], row["content_sha256"])
    op(http, "agent", {"op": "retire", "def_id": v2["def_id"], "retired": True})
    resp = http.post("/v1/runs", json={"agent": "pinned", "prompt": "c", "background": True})
    assert resp.status_code == 400 and resp.json()["code"] == "unknown_agent"  # a retired active def is not found


def _author_agent(http: httpx.Client, name: str, tool_input: dict[str, Any], **extra: Any) -> None:
    model = "mock-tool-loop?tool=AgentDef&calls=1&input=" + quote(json.dumps(tool_input))
    overlay = {"provider": "mock", "model": model, "tools": ["AgentDef", "Context"], **extra}
    op(http, "agent", {"op": "create", "name": name, "overlay": overlay})


def _tool_result(run_id: str) -> dict[str, Any]:
    event = RunEvent.objects.get(run_id=run_id, type="tool_result")
    payload: dict[str, Any] = event.payload
    return payload


def test_agents_author_definitions_with_the_agentdef_tool(http: httpx.Client, stack: Any) -> None:
    create = {
        "op": "create",
        "name": "child-x",
        "overlay": {"provider": "mock", "model": "mock-generic", "tools": ["Context"]},
    }
    _author_agent(http, "author", create, agent_def_scopes=["named:child-x"])
    run = http.post("/v1/runs", json={"agent": "author", "prompt": "go", "background": True}).json()
    wait_status(run["run_id"], RunStatus.COMPLETED)
    result = _tool_result(run["run_id"])
    assert result["is_error"] is False, result
    row = json.loads(result["text"])
    assert (row["name"], row["version"], row["promoted"]) == ("child-x", 1, True)
    assert row["created_by_agent_id"] == run["agent_id"]
    stored = AgentDef.objects.get(id=row["def_id"])
    assert (stored.created_by_run_id, stored.created_by) == (run["run_id"], "agent:author")
    # The new agent runs.
    child = http.post("/v1/runs", json={"agent": "child-x", "prompt": "hi", "background": True}).json()
    assert wait_status(child["run_id"], RunStatus.COMPLETED).agent_def_id == row["def_id"]


@pytest.mark.parametrize(
    ("tool_input", "extra", "needle"),
    [
        ({"op": "list", "name": "echo"}, {}, "no agent_def_scopes (default-deny)"),
        ({"op": "list", "name": "echo"}, {"agent_def_scopes": ["named:other"]}, "not in this agent's scopes"),
        (
            {"op": "create", "name": "wide", "overlay": {"provider": "mock", "model": "m", "tools": ["Grep"]}},
            {"agent_def_scopes": ["any"]},
            "cannot widen",
        ),
    ],
)
def test_agentdef_tool_refusals_are_is_error_results(
    http: httpx.Client, stack: Any, tool_input: dict[str, Any], extra: dict[str, Any], needle: str
) -> None:
    _author_agent(http, "refused-author", tool_input, **extra)
    run = http.post("/v1/runs", json={"agent": "refused-author", "prompt": "go", "background": True}).json()
    wait_status(run["run_id"], RunStatus.COMPLETED)
    result = _tool_result(run["run_id"])
    assert result["is_error"] is True and needle in result["text"], result
    assert not AgentDef.objects.filter(name="wide").exists()


def test_agents_see_only_their_tenant_and_shared_defs(http: httpx.Client, stack: Any) -> None:
    """An agent's def ops are stamped with its run's tenant."""
    _author_agent(http, "lister", {"op": "list", "name": "lister"}, agent_def_scopes=["self"])
    run = http.post("/v1/runs", json={"agent": "lister", "prompt": "go", "background": True}).json()
    wait_status(run["run_id"], RunStatus.COMPLETED)
    listed = json.loads(_tool_result(run["run_id"])["text"])
    assert [v["version"] for v in listed["versions"]] == [1] and listed["versions"][0]["tenant_id"] == ""


def test_an_overlong_model_or_provider_is_refused_not_a_500(http: httpx.Client) -> None:
    cases = (({"provider": "mock", "model": "m" * 257}, "model"), ({"provider": "p" * 65, "model": "m"}, "provider"))
    for overlay, field in cases:
        refused = op(http, "agent", {"op": "create", "name": "too-long", "overlay": overlay}, status=422)
        assert refused["code"] == "tool_refused" and f"{field} is longer than" in refused["error"]
