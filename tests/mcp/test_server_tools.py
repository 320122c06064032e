"""The runtime's MCP tools on their positive paths (issue 21, server half): `memory_set`
then `memory_search`, `skilldef`, `send_input` to a parked interactive run, and the admin's
`pause` / `resume`, each called with the SDK's Streamable HTTP client over `/v1/_mcp` on the
session's Daphne and Celery workers (real Postgres, Redis)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mcp.client import Client

from apps.runs import services as run_services
from apps.runs.models import RunEvent, RunStatus
from apps.substrate import tokens
from tests.conftest import wait_for, wait_status
from tests.factories.mcp import call, over_http, script

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_memory_set_with_embed_then_memory_search_finds_it(web: str, people: dict[str, dict[str, str]]) -> None:
    runbook = {"service": "payments", "steps": 4}
    pie = {"dish": "apple pie"}

    async def work(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        slot = {"scope": "user", "scope_id": "u1"}
        first = await call(
            client,
            "memory_set",
            {**slot, "key": "runbook", "value": runbook, "embed": True, "embed_text": "payments deploy runbook"},
        )
        second = await call(
            client, "memory_set", {**slot, "key": "pie", "value": pie, "embed": True, "embed_text": "apple pie recipe"}
        )
        found = await call(client, "memory_search", {**slot, "query": "payments deploy runbook", "top_k": 1})
        elsewhere = await call(client, "memory_search", {**slot, "scope_id": "u2", "query": "payments deploy runbook"})
        return first, second, found, elsewhere

    first, second, (error, found), (other_error, elsewhere) = over_http(web, people["alice"], work)
    assert first == (False, {"scope": "user", "scope_id": "u1", "key": "runbook", "embedded": True})
    assert second[0] is False and second[1]["embedded"] is True
    assert not error, found
    assert [(e["key"], e["value"]) for e in found["entries"]] == [("runbook", runbook)]
    assert found["truncated"] is True and found["entries"][0]["similarity"] > 0.99
    assert not other_error and elsewhere["entries"] == []  # another user's slot holds neither


def test_skilldef_creates_lists_and_gets_a_skill(web: str, people: dict[str, dict[str, str]]) -> None:
    async def work(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        overlay = {"body": "Be brief."}
        created = await call(client, "skilldef", {"op": "create", "name": "summarise", "overlay": overlay})
        listed = await call(client, "skilldef", {"op": "list", "name": "summarise"})
        got = await call(client, "skilldef", {"op": "get", "def_id": created[1].get("def_id", "")})
        return created, listed, got

    (error, created), (list_error, listed), (get_error, got) = over_http(web, people["alice"], work)
    assert not error, created
    assert (created["name"], created["version"], created["promoted"]) == ("summarise", 1, True)
    assert created["definition"]["body"] == "Be brief." and created["content_sha256"].startswith("sha256:")
    assert not list_error, listed
    assert listed["name"] == "summarise"
    assert [(v["def_id"], v["promoted"]) for v in listed["versions"]] == [(created["def_id"], True)]
    assert not get_error and got["def_id"] == created["def_id"] and got["definition"]["body"] == "Be brief."

    async def other_tenant(client: Client) -> tuple[bool, dict[str, Any]]:
        return await call(client, "skilldef", {"op": "get", "def_id": created["def_id"]})

    error, body = over_http(web, people["charlie"], other_tenant)
    assert error and body["code"] == "not_found"


def test_send_input_continues_a_parked_interactive_run(
    web: str, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    body = {"agent": "scripted", "prompt": script({"text": "first turn"}, {"echo": True}), "interactive": True}
    started = http.post("/v1/runs", json={**body, "background": True}, headers=people["alice"])
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    wait_status(run_id, RunStatus.AWAITING_INPUT, timeout=30)

    async def send(client: Client) -> tuple[bool, dict[str, Any]]:
        return await call(client, "send_input", {"run_id": run_id, "text": "the second turn"})

    error, sent = over_http(web, people["alice"], send)
    assert not error, sent
    parked = RunEvent.objects.filter(run_id=run_id, type="awaiting_input")
    wait_for(lambda: parked.count() == 2, timeout=30)  # the second turn ran and the run parked again
    texts = [e.payload["text"] for e in RunEvent.objects.filter(run_id=run_id, type="text").order_by("seq")]
    assert texts[0] == "first turn" and json.loads(texts[-1])["messages"][-1]["text"] == "the second turn"
    assert wait_status(run_id, RunStatus.AWAITING_INPUT).status == RunStatus.AWAITING_INPUT

    error, refused = over_http(web, people["charlie"], send)  # beta: acme's run does not exist
    assert error and refused["code"] == "not_found"
    http.post(f"/v1/agents/{started.json()['agent_id']}/cancel", headers=people["alice"]).raise_for_status()
    wait_status(run_id, RunStatus.CANCELLED)


def test_pause_then_resume_over_mcp_leaves_the_runtime_running(web: str, people: dict[str, dict[str, str]]) -> None:
    admin = {"authorization": "Bearer " + tokens.token_create(name="mcp-admin", tenant_id="ops")["token"]}

    async def work(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        paused = await call(client, "pause", {"timeout_ms": 5000})
        while_paused = await call(client, "state", {})
        resumed = await call(client, "resume", {})
        after = await call(client, "state", {})
        return paused, while_paused, resumed, after

    try:
        (error, paused), (_, while_paused), (resume_error, resumed), (_, after) = over_http(web, admin, work)
    finally:  # whatever failed, the runtime is left running for the next test
        if run_services.runtime_state_get() != "running":
            run_services.runtime_resume()
    assert not error and paused["state"] == "paused" and paused["warnings"] == []
    assert while_paused == {"state": "paused", "paused_runs_count": 0}
    assert not resume_error and resumed["state"] == "running"
    assert after == {"state": "running", "paused_runs_count": 0}
