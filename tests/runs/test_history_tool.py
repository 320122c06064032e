"""The History tool (issue 38): an agent lists, searches and reads past conversations within its
`history_scope` (default-deny), owners from the run never from the input; `history_scope` is no
longer announced as inert. Real workers and the mock provider's scripted tool calls."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _run(agent: str, user: str, script: list[dict[str, Any]], prompt: str = "") -> str:
    who = Principal(tenant_id="acme", subject=user, scopes=frozenset({"substrate:tenant"}))
    text = f"{prompt}\nMOCK_SCRIPT: {json.dumps(script)}"
    run = services.run_create(principal=who, data=services.RunCreate(agent=agent, segments=[Segment(text=text)]))
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    return run.id


def _results(run_id: str) -> dict[str, tuple[bool, str]]:
    """Each History call's (is_error, text), by its input (tool calls of one step run concurrently)."""
    rows = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return {
        json.dumps(e.payload["tool_use"]["input"], sort_keys=True): (e.payload["is_error"], e.payload["text"])
        for e in rows
    }


def _of(results: dict[str, tuple[bool, str]], **call: Any) -> tuple[bool, str]:
    return results[json.dumps(call, sort_keys=True)]


def _define(http: httpx.Client, alice: dict[str, str], name: str, **fields: Any) -> None:
    overlay = {"provider": "mock", "model": "mock-script", "tools": ["History"], **fields}
    resp = http.post("/v1/_agentdef", headers=alice, json={"op": "create", "name": name, "overlay": overlay})
    assert resp.status_code == 200, resp.text


def _calls(*inputs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tools": [{"tool": "History", "input": i} for i in inputs]}, {"text": "done"}]


def test_history_lists_and_reads_the_users_own_chats_only(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    _define(http, people["alice"], "acme-historian", history_scope=["user"])
    mine = _run("scripted", "ann", [{"text": "Lisbon it is"}], prompt="plan the trip to Lisbon")
    theirs = _run("scripted", "ben", [{"text": "ok"}], prompt="ben's secret plan")
    mine_s, theirs_s = Run.objects.get(id=mine).session_id, Run.objects.get(id=theirs).session_id
    run = _run(
        "acme-historian",
        "ann",
        _calls(
            {"op": "list", "scope": "user"},
            {"op": "get", "scope": "user", "session_id": mine_s},
            {"op": "get", "scope": "user", "session_id": theirs_s},
            {"op": "list", "scope": "tenant"},
            {"op": "search", "scope": "user", "query": "lisbon"},
        ),
    )
    results = _results(run)
    ok_list, listed = _of(results, op="list", scope="user")
    ok_get, got = _of(results, op="get", scope="user", session_id=mine_s)
    bad_get, other = _of(results, op="get", scope="user", session_id=theirs_s)
    bad_scope, scoped = _of(results, op="list", scope="tenant")
    ok_search, found = _of(results, op="search", scope="user", query="lisbon")
    assert not ok_list and mine_s in listed and theirs_s not in listed and "secret" not in listed
    assert not ok_get and "Lisbon it is" in got and "plan the trip to Lisbon" in got
    assert bad_get and "session_not_found" in other and "secret" not in other
    assert bad_scope and "not permitted" in scoped
    assert not ok_search and mine_s in found


def test_an_agent_without_history_scope_is_refused_and_no_inert_announcement(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    _define(http, people["alice"], "acme-amnesiac")
    run = _run("acme-amnesiac", "ann", _calls({"op": "list"}))
    refused, text = _of(_results(run), op="list")
    assert refused and "default-deny" in text
    _define(http, people["alice"], "acme-scoped", history_scope=["self"])
    scoped = _run("acme-scoped", "ann", _calls({"op": "list"}))
    inert = RunEvent.objects.filter(run_id=scoped, type="capability_inert")
    assert not [e for e in inert if "history_scope" in json.dumps(e.payload)]
    assert not _of(_results(scoped), op="list")[0]
