"""The `Memory` tool in real runs (mock provider, real workers) and the
`/v1/_memory` REST plane against the real Daphne: persistence across runs,
default-deny scopes, tenant isolation, limits, and 50 concurrent increments."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from apps.memory import selectors
from apps.memory.services import Slot
from apps.runs.models import RunEvent, RunStatus
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents")


def _agent(http: httpx.Client, name: str, tool_input: dict[str, Any], **extra: Any) -> None:
    model = "mock-tool-loop?tool=Memory&calls=1&latency_ms=0&input=" + quote(json.dumps(tool_input))
    overlay = {"provider": "mock", "model": model, "tools": ["Memory"], **extra}
    resp = http.post("/v1/_agentdef", json={"op": "create", "name": name, "overlay": overlay})
    assert resp.status_code == 200, resp.text


def _run(http: httpx.Client, agent: str, user_id: str = "") -> dict[str, Any]:
    body = {"agent": agent, "prompt": "go", "background": True, **({"user_id": user_id} if user_id else {})}
    run = http.post("/v1/runs", json=body).json()
    wait_status(run["run_id"], RunStatus.COMPLETED)
    payload: dict[str, Any] = RunEvent.objects.get(run_id=run["run_id"], type="tool_result").payload
    return payload


def _ok(result: dict[str, Any]) -> Any:
    assert result["is_error"] is False, result
    return json.loads(result["text"])


def test_memory_persists_across_runs(http: httpx.Client, stack: Any) -> None:
    _agent(
        http,
        "mem-writer",
        {"op": "set", "scope": "user", "key": "pref", "value": {"lang": "fr"}},
        memory_scopes=["user"],
    )
    _agent(http, "mem-reader", {"op": "get", "scope": "user", "key": "pref"}, memory_scopes=["user"])
    assert _ok(_run(http, "mem-writer", user_id="u1"))["ok"] is True
    assert _ok(_run(http, "mem-reader", user_id="u1")) == {"value": {"lang": "fr"}, "expires_at": None}
    assert _ok(_run(http, "mem-reader", user_id="u2")) == {"value": None, "expires_at": None}  # another user


def test_agent_scope_is_keyed_by_the_agent_name(http: httpx.Client, stack: Any) -> None:
    _agent(http, "mem-agent", {"op": "incr", "scope": "agent", "key": "runs"}, memory_scopes=["agent"])
    assert _ok(_run(http, "mem-agent"))["value"] == 1
    assert _ok(_run(http, "mem-agent"))["value"] == 2
    assert selectors.memory_get(slot=Slot("", "agent", "mem-agent"), key="runs").value == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tool_input", "extra", "needle"),
    [
        ({"op": "get", "scope": "tenant", "key": "k"}, {}, "memory is default-deny"),
        ({"op": "get", "scope": "tenant", "key": "k"}, {"memory_scopes": ["agent"]}, "'tenant' is not in this agent"),
        ({"op": "get", "scope": "user", "key": "k"}, {"memory_scopes": ["user"]}, "needs the run's user_id"),
        ({"op": "merge", "scope": "agent", "key": "k"}, {"memory_scopes": ["agent"]}, "unknown op 'merge'"),
        ({"op": "search", "scope": "agent", "query": "x", "top_k": 99}, {"memory_scopes": ["agent"]}, "top_k"),
    ],
)
def test_refusals_are_is_error_results(
    http: httpx.Client, stack: Any, tool_input: dict[str, Any], extra: dict[str, Any], needle: str
) -> None:
    _agent(http, "mem-refused", tool_input, **extra)
    result = _run(http, "mem-refused")
    assert result["is_error"] is True and needle in result["text"], result


def test_incr_on_a_non_number_is_an_error(http: httpx.Client, stack: Any) -> None:
    http.put("/v1/_memory/scopes/tenant/-/keys/label", json={"value": "text"}).raise_for_status()
    _agent(http, "mem-incr", {"op": "incr", "scope": "tenant", "key": "label"}, memory_scopes=["tenant"])
    result = _run(http, "mem-incr")
    assert result["is_error"] is True and "not a JSON number" in result["text"], result


def test_search_through_the_tool(http: httpx.Client, stack: Any) -> None:
    for key, text in (("cat", "the cat sat on the mat"), ("soup", "tomato soup recipe")):
        http.put(f"/v1/_memory/scopes/agent/mem-search/keys/{key}?embed=true", json={"value": text}).raise_for_status()
    _agent(
        http, "mem-search", {"op": "search", "scope": "agent", "query": "cat mat", "top_k": 1}, memory_scopes=["agent"]
    )
    out = _ok(_run(http, "mem-search"))
    assert [e["key"] for e in out["entries"]] == ["cat"] and out["truncated"] is True
    assert out["entries"][0]["embedded_with"] == {"provider": "hashing", "model": "hashing-v1"}


def test_50_concurrent_incr_runs_end_at_50(http: httpx.Client, stack: Any) -> None:
    _agent(http, "mem-counter", {"op": "incr", "scope": "tenant", "key": "hits"}, memory_scopes=["tenant"])
    runs = [
        http.post("/v1/runs", json={"agent": "mem-counter", "prompt": "go", "background": True}).json()
        for _ in range(50)
    ]
    values = []
    for run in runs:
        wait_status(run["run_id"], RunStatus.COMPLETED, timeout=60)
        values.append(_ok(RunEvent.objects.get(run_id=run["run_id"], type="tool_result").payload)["value"])
    assert sorted(values) == list(range(1, 51))  # every increment saw a distinct count
    assert selectors.memory_get(slot=Slot("", "tenant", ""), key="hits").value == 50  # type: ignore[union-attr]


def test_rest_crud(http: httpx.Client) -> None:
    base = "/v1/_memory/scopes/agent/bot/keys"
    resp = http.put(f"{base}/notes/today", json={"value": {"todo": ["a"]}, "ttl_seconds": 3600})
    assert resp.status_code == 200 and resp.json() == {
        "scope": "agent",
        "scope_id": "bot",
        "key": "notes/today",
        "embedded": False,
    }
    http.put(f"{base}/notes/tomorrow", json={"value": 2, "embed": True}).raise_for_status()
    got = http.get(f"{base}/notes/today").json()
    assert got["entry"]["value"] == {"todo": ["a"]} and got["entry"]["expires_at"] is not None
    listed = http.get(base, params={"prefix": "notes/", "limit": 1}).json()
    assert [e["key"] for e in listed["entries"]] == ["notes/today"] and listed["truncated"] is True
    assert [e["embedded"] for e in http.get(base).json()["entries"]] == [False, True]
    assert http.delete(f"{base}/notes/today").status_code == 204
    assert http.delete(f"{base}/notes/today").status_code == 204  # idempotent
    missing = http.get(f"{base}/notes/today")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    found = http.post("/v1/_memory/search", json={"query": "tomorrow", "scope": "agent", "scope_id": "bot"}).json()
    assert [e["key"] for e in found["entries"]] == ["notes/tomorrow"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/_memory/scopes/planet/x/keys/k", {"value": 1}, 400, "invalid_scope"),
        ("/v1/_memory/scopes/agent/bot/keys/k", {}, 400, "missing_value"),
        ("/v1/_memory/scopes/agent/bot/keys/k", {"value": None}, 400, "missing_value"),
        ("/v1/_memory/scopes/agent/bot/keys/k", {"value": 1, "ttl_seconds": -5}, 400, "invalid_value"),
        ("/v1/_memory/scopes/agent/bot/keys/k", {"value": "x" * 70_000}, 413, "memory_value_too_large"),
        ("/v1/_memory/scopes/user/-/keys/k", {"value": 1}, 400, "missing_scope_id"),
    ],
)
def test_rest_put_errors(http: httpx.Client, path: str, body: dict[str, Any], status: int, code: str) -> None:
    resp = http.put(path, json=body)
    assert (resp.status_code, resp.json()["code"]) == (status, code), resp.text


def test_rest_scope_quota_is_413(http: httpx.Client) -> None:
    base = "/v1/_memory/scopes/agent/quota-bot/keys"
    for i in range(16):  # 16 x ~64 KiB = the 1 MiB default quota
        assert http.put(f"{base}/k{i}", json={"value": "x" * 65_000}).status_code == 200
    resp = http.put(f"{base}/one-more", json={"value": "x" * 65_000})
    assert (resp.status_code, resp.json()["code"]) == (413, "memory_quota_exceeded")
    assert http.get(f"{base}/one-more").status_code == 404


def test_rest_tenant_isolation(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    alice, charlie = people["alice"], people["charlie"]
    key = "/v1/_memory/scopes/tenant/-/keys/secret"
    assert http.put(key, json={"value": "acme only"}, headers=alice).status_code == 200
    assert http.get(key, headers=alice).json()["entry"]["value"] == "acme only"
    assert http.get(key, headers=charlie).status_code == 404
    assert http.get("/v1/_memory/scopes/tenant/-/keys", headers=charlie).json()["entries"] == []
    assert http.delete(key, headers=charlie).status_code == 204
    assert http.get(key, headers=alice).status_code == 200  # charlie's delete touched nothing of acme's
    assert http.put("/v1/_memory/scopes/global/-/keys/g", json={"value": 1}, headers=alice).status_code == 403
    assert http.get(key).status_code == 401  # no credential outside open mode
