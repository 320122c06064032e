"""The runtime over MCP (issue 21, server half): the SDK's own Streamable HTTP
client drives `/v1/_mcp` on a real Daphne with the session's Celery workers
(real Postgres, Redis), and the SDK's stdio client drives `manage.py mcp`.

Tokens (tests/conftest.py `people`): alice (acme, substrate:tenant), bob
(acme, runs:* only), charlie (beta, substrate:tenant); plus an admin token."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mcp.client import Client

from apps.runs.models import RunStatus
from apps.substrate import tokens
from tests.conftest import wait_status
from tests.factories.mcp import call, over_http, over_stdio, script

pytestmark = pytest.mark.usefixtures("agents", "stack")

ADMIN_TOOLS = {"pause", "resume", "state"}


def test_spawn_run_waits_for_its_result_and_its_events_and_transcript_are_readable(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    spawn = {"agent": "scripted", "prompt": script({"text": "hello over mcp"}), "wait": True, "wait_seconds": 60}

    async def work(client: Client) -> tuple[dict[str, Any], ...]:
        error, spawned = await call(client, "spawn_run", spawn)
        assert not error, spawned
        run_id = spawned["run_id"]
        _, run = await call(client, "get_run", {"run_id": run_id})
        _, events = await call(client, "run_events", {"run_id": run_id, "from_seq": 0})
        _, later = await call(client, "run_events", {"run_id": run_id, "from_seq": events["last_seq"]})
        transcript = await client.read_resource(f"loomcycle://runs/{run_id}/transcript")
        return spawned, run, events, later, json.loads(transcript.contents[0].text)  # type: ignore[union-attr]

    spawned, run, events, later, transcript = over_http(web, people["alice"], work)
    assert spawned["result"] == "hello over mcp" and spawned["timed_out"] is False
    assert spawned["status"] == "completed" and spawned["run_id"].startswith("r_")
    assert run["status"] == "completed" and run["run_id"] == spawned["run_id"]
    types = [e["type"] for e in events["events"]]
    assert "user_input" in types and "text" in types
    assert [e["payload"]["text"] for e in events["events"] if e["type"] == "text"] == ["hello over mcp"]
    assert later["events"] == []
    assert [e["seq"] for e in transcript["events"]] == [e["seq"] for e in events["events"]]

    async def other_tenant(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        return (
            await call(client, "get_run", {"run_id": spawned["run_id"]}),
            await call(client, "cancel_run", {"run_id": spawned["run_id"]}),
        )

    for error, body in over_http(web, people["charlie"], other_tenant):  # beta: acme's run does not exist
        assert error and body["code"] == "not_found" and body["status"] == 404


def test_a_wait_is_bounded_and_the_waiting_run_can_be_cancelled(web: str, people: dict[str, dict[str, str]]) -> None:
    park = {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000, "max_messages": 1}
    spawn = {"agent": "scripted", "prompt": script({"tool": "Channel", "input": park}), "wait": True, "wait_seconds": 1}

    async def work(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        _, spawned = await call(client, "spawn_run", spawn)
        cancelled = await call(client, "cancel_run", {"run_id": spawned["run_id"], "reason": "test"})
        bad = await call(client, "get_run", {"run_id": "not an id!"})
        return (False, spawned), cancelled, bad

    (_, spawned), (error, cancelled), (bad_error, bad) = over_http(web, people["alice"], work)
    assert spawned["timed_out"] is True and spawned["status"] == "running" and spawned["result"] is None
    assert not error, cancelled
    assert wait_status(spawned["run_id"], RunStatus.CANCELLED, timeout=30)
    assert bad_error and bad["code"] == "invalid_body" and bad["details"]["errors"][0]["loc"] == ["run_id"]


def test_memory_round_trip_stays_in_the_callers_tenant(web: str, people: dict[str, dict[str, str]]) -> None:
    async def write_then_read(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        value = {"colour": "teal", "n": 3}
        put = await call(client, "memory_set", {"scope": "tenant", "key": "prefs/colour", "value": value})
        got = await call(client, "memory_get", {"scope": "tenant", "key": "prefs/colour"})
        bad = await call(client, "memory_set", {"scope": "tenant", "key": "k", "value": None})
        return put, got, bad

    put, got, bad = over_http(web, people["alice"], write_then_read)
    assert put == (False, {"scope": "tenant", "scope_id": "", "key": "prefs/colour", "embedded": False})
    assert got[0] is False and got[1]["entry"]["value"] == {"colour": "teal", "n": 3}
    assert bad[0] is True and bad[1]["code"] == "missing_value"

    async def read(client: Client) -> tuple[bool, dict[str, Any]]:
        return await call(client, "memory_get", {"scope": "tenant", "key": "prefs/colour"})

    error, body = over_http(web, people["charlie"], read)
    assert error and body["code"] == "not_found"


def test_channel_and_agentdef_tools_reach_the_rest_services(web: str, people: dict[str, dict[str, str]]) -> None:
    async def work(client: Client) -> tuple[tuple[bool, dict[str, Any]], ...]:
        published = await call(client, "channel_publish", {"channel": "per-user", "user_id": "u1", "payload": {"x": 1}})
        read = await call(client, "channel_subscribe", {"channel": "per-user", "user_id": "u1", "wait_ms": 5000})
        unknown = await call(client, "agentdef", {"op": "get", "def_id": "def_0000000000000000"})
        return published, read, unknown

    (pub_error, published), (read_error, read), (def_error, unknown) = over_http(web, people["alice"], work)
    assert not pub_error and published["channel"] == "per-user"
    assert not read_error and [m["value"] for m in read["messages"]] == [{"x": 1}]
    assert def_error and unknown["code"] == "not_found" and unknown["details"] == {"tool": "AgentDef"}


def test_a_tenant_token_neither_sees_nor_calls_admin_tools(web: str, people: dict[str, dict[str, str]]) -> None:
    admin = {"authorization": "Bearer " + tokens.token_create(name="mcp-admin", tenant_id="ops")["token"]}

    async def tools_and_state(client: Client) -> tuple[set[str], tuple[bool, dict[str, Any]]]:
        listed = {t.name for t in (await client.list_tools()).tools}
        return listed, await call(client, "state", {})

    listed, (error, body) = over_http(web, people["alice"], tools_and_state)
    assert listed.isdisjoint(ADMIN_TOOLS)
    assert {"spawn_run", "get_run", "run_events", "memory_get", "agentdef", "channel_publish"} <= listed
    assert error and body["code"] == "insufficient_scope" and body["status"] == 403

    listed, (error, body) = over_http(web, admin, tools_and_state)
    assert ADMIN_TOOLS <= listed
    assert not error and body == {"state": "running", "paused_runs_count": 0}


def test_a_missing_or_wrong_bearer_is_refused_before_mcp(web: str, people: dict[str, dict[str, str]]) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    accept = {"accept": "application/json, text/event-stream"}
    for auth in ({}, {"authorization": "Bearer lct_wrong"}):
        resp = httpx.post(web + "/v1/_mcp", json=init, headers={**accept, **auth}, timeout=10)
        assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"
    member = httpx.post(web + "/v1/_mcp", json=init, headers={**accept, **people["bob"]}, timeout=10)
    assert member.status_code == 403 and member.json()["code"] == "insufficient_scope"
    assert member.headers["www-authenticate"] == 'Bearer scope="substrate:tenant"'
    ok = httpx.post(web + "/v1/_mcp", json=init, headers={**accept, **people["alice"]}, timeout=10)
    assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]["name"] == "loomcycle"
    # Stateless: a handshake-era client's next request stands on its own, with the same principal.
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    legacy = {**accept, **people["alice"], "mcp-protocol-version": "2025-06-18"}
    names = {t["name"] for t in httpx.post(web + "/v1/_mcp", json=listing, headers=legacy).json()["result"]["tools"]}
    assert "spawn_run" in names and names.isdisjoint(ADMIN_TOOLS)


def test_open_mode_serves_loopback_hosts_and_same_site_clients_only(web: str) -> None:
    """No token exists: the open-mode admin, with REST's DNS-rebinding and cross-site refusals."""
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    base = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}
    rebound = httpx.post(web + "/v1/_mcp", json=listing, headers={**base, "host": "evil.example"}, timeout=10)
    assert rebound.status_code == 400 and rebound.json()["code"] == "open_mode_host"
    page = httpx.post(web + "/v1/_mcp", json=listing, headers={**base, "origin": "http://evil.example"}, timeout=10)
    assert page.status_code == 403 and page.json()["code"] == "cross_site_request"
    ok = httpx.post(web + "/v1/_mcp", json=listing, headers=base, timeout=10)
    assert ok.status_code == 200 and ADMIN_TOOLS <= {t["name"] for t in ok.json()["result"]["tools"]}


def test_manage_py_mcp_serves_the_tools_over_stdio(
    stack_env: dict[str, str], people: dict[str, dict[str, str]]
) -> None:
    token = people["alice"]["authorization"].removeprefix("Bearer ")

    async def work(client: Client) -> tuple[set[str], tuple[bool, dict[str, Any]], tuple[bool, dict[str, Any]]]:
        listed = {t.name for t in (await client.list_tools()).tools}
        put = await call(client, "memory_set", {"scope": "tenant", "key": "from-stdio", "value": [1, 2]})
        got = await call(client, "memory_get", {"scope": "tenant", "key": "from-stdio"})
        return listed, put, got

    listed, put, got = over_stdio(["mcp", "--token", token], stack_env, work)
    assert "memory_get" in listed and listed.isdisjoint(ADMIN_TOOLS)
    assert put[0] is False and got[0] is False
    assert got[1]["scope"] == "tenant" and got[1]["entry"]["value"] == [1, 2]


def test_manage_py_mcp_with_a_url_proxies_a_remote_runtime(
    web: str, stack_env: dict[str, str], people: dict[str, dict[str, str]]
) -> None:
    env = {**stack_env, "LOOMCYCLE_TOKEN": people["charlie"]["authorization"].removeprefix("Bearer ")}

    async def work(client: Client) -> tuple[set[str], tuple[bool, dict[str, Any]]]:
        listed = {t.name for t in (await client.list_tools()).tools}
        return listed, await call(client, "get_run", {"run_id": "r_0000000000000000"})

    listed, (error, body) = over_stdio(["mcp", "--url", web + "/v1/_mcp"], env, work)
    assert "spawn_run" in listed and listed.isdisjoint(ADMIN_TOOLS)  # the remote's list for charlie's token
    assert error and body["code"] == "not_found"
