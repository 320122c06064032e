"""MCP servers' tools in real runs: mock-script agents on real workers call the
reference stdio time server (mcp-server-time, from PyPI) and a streamable-HTTP
server built with the SDK on a loopback port (tests/mcp/servers.py). The workers'
network settings: tests/conftest.py stack_env (only `localhost` may be non-public)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.mcp import services
from apps.mcp.models import DiscoveredTools
from apps.runs import services as run_services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.substrate.kinds import Refused
from tests.conftest import unicode_escaped, wait_for, wait_status
from tests.factories.runs import _pg_dump
from tests.mcp.conftest import mcpserver_op
from tests.mcp.servers import WAITING, Recorder
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "mcp_net")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
BEARER = "bearer-of-alice-0123456789"
TRACKER_KEY = "trk-key-5f4e3d2c1b0a"


def run(steps: list[dict[str, Any]], **kw: Any) -> Run:
    prompt = f"Use the tools. MOCK_SCRIPT: {json.dumps(steps)}"
    data = run_services.RunCreate(agent="mcp-user", segments=[Segment(text=prompt)], **kw)
    return run_services.run_create(principal=ACME, data=data)


def results(run_id: str) -> dict[str, dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return {e.payload["tool_use"]["name"]: {"text": e.payload["text"], "error": e.payload["is_error"]} for e in rows}


def test_an_agent_gets_the_time_from_the_stdio_server(stack: WorkerPool) -> None:
    [report] = services.mcp_static_servers_discover()  # what `manage.py boot` does
    assert report["ok"] and report["tools"] == ["get_current_time", "convert_time"]
    convert = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    calls = [
        {"tool": "mcp__time__get_current_time", "input": {"timezone": "Europe/Paris"}},
        {"tool": "mcp__time__convert_time", "input": convert},
    ]
    done = run([{"tools": calls}, {"text": "done"}])
    wait_status(done.id, RunStatus.COMPLETED, timeout=90)
    got = results(done.id)
    assert not got["mcp__time__get_current_time"]["error"]
    assert json.loads(got["mcp__time__get_current_time"]["text"])["timezone"] == "Europe/Paris"
    converted = json.loads(got["mcp__time__convert_time"]["text"])
    assert converted["target"]["timezone"] == "Asia/Tokyo" and converted["target"]["datetime"].endswith(
        "T21:00:00+09:00"
    )


def test_an_http_server_gets_the_runs_credentials_and_its_list_changes_are_cached(
    stack: WorkerPool, loopback: tuple[int, Recorder]
) -> None:
    port, recorder = loopback
    overlay = {
        "transport": "streamable-http",
        "url": f"http://localhost:{port}/mcp",
        "headers": {"Authorization": "Bearer ${run.user_bearer}"},
    }
    created = mcpserver_op("acme", {"op": "create", "name": "loopback", "overlay": overlay})
    assert created["discovery"] == {
        "def_id": created["def_id"],
        "name": "loopback",
        "ok": True,
        "tools": ["echo", "fail", "garble", "wait", "grow"],
    }
    assert recorder.authorizations("localhost") == {""}  # discovery has no run: the templated header is left out
    recorder.seen.clear()

    calls = [
        {"tool": "mcp__loopback__echo", "input": {"text": f"hi {BEARER}"}},
        {"tool": "mcp__loopback__fail", "input": {"reason": "test"}},
        {"tool": "mcp__loopback__grow", "input": {}},
    ]
    done = run([{"tools": calls}, {"text": "done"}], credentials={"user_bearer": BEARER})
    wait_status(done.id, RunStatus.COMPLETED, timeout=60)
    got = results(done.id)
    echoed = got["mcp__loopback__echo"]
    assert not echoed["error"] and echoed["text"].startswith("echo: hi [redacted:") and BEARER not in echoed["text"]
    assert got["mcp__loopback__fail"]["error"] and "Error executing tool fail" in got["mcp__loopback__fail"]["text"]
    assert got["mcp__loopback__grow"] == {"text": "grown", "error": False}

    # `grow` announced a new tool: the worker re-discovered the server and the cache has it,
    # listed without the run's credentials (the cache is shared by every run of the tenant).
    assert wait_for(lambda: _cached_names(created["def_id"]) == ["echo", "fail", "garble", "wait", "grow", "shout"])
    assert recorder.authorizations("localhost") == {f"Bearer {BEARER}", ""}


def test_a_run_credential_fills_an_http_servers_header_at_call_time_and_is_stored_nowhere(
    stack: WorkerPool, loopback: tuple[int, Recorder], stack_env: dict[str, str]
) -> None:
    port, recorder = loopback
    overlay = {
        "transport": "streamable-http",
        "url": f"http://localhost:{port}/mcp",
        "headers": {"X-Api-Key": "${run.credentials.tracker_key}"},
    }
    recorder.requests.clear()
    created = mcpserver_op("acme", {"op": "create", "name": "tracker", "overlay": overlay})
    assert created["discovery"]["ok"] and "echo" in created["discovery"]["tools"]
    assert recorder.calls("tools/list") and all("x-api-key" not in r.headers for r in recorder.requests)
    recorder.requests.clear()

    script = json.dumps([{"tool": "mcp__tracker__echo", "input": {"text": "key=@KEY@"}}, {"text": "done"}])
    prompt = "Use the tools. MOCK_SCRIPT: " + script.replace("@KEY@", unicode_escaped(TRACKER_KEY))
    assert TRACKER_KEY not in prompt
    data = run_services.RunCreate(
        agent="mcp-user", segments=[Segment(text=prompt)], credentials={"tracker_key": TRACKER_KEY}
    )
    done = run_services.run_create(principal=ACME, data=data)
    wait_status(done.id, RunStatus.COMPLETED, timeout=60)
    [called] = recorder.calls("tools/call")
    assert called.headers["x-api-key"] == TRACKER_KEY  # the server saw the run's credential
    assert {r.headers.get("x-api-key") for r in recorder.requests} == {TRACKER_KEY}  # on every request of the session
    echoed = results(done.id)["mcp__tracker__echo"]
    # The server echoed the key back; the result is redacted before the model or the database sees it.
    assert echoed == {"text": "echo: key=[redacted:run.credentials.tracker_key]", "error": False}

    # A run without the credential gets an error result, and nothing is sent.
    recorder.requests.clear()
    bare = run([{"tool": "mcp__tracker__echo", "input": {"text": "x"}}, {"text": "done"}])
    wait_status(bare.id, RunStatus.COMPLETED, timeout=60)
    refused = results(bare.id)["mcp__tracker__echo"]
    assert refused["error"]
    assert "'${run.credentials.tracker_key}' names a credential this run does not carry" in refused["text"]
    # Nothing from that run (the first run's pooled session, keyed, may still be on its GET stream).
    assert all(r.headers.get("x-api-key") == TRACKER_KEY for r in recorder.requests)

    dump = _pg_dump(stack_env["DATABASE_URL"])
    assert done.id in dump and "[redacted:run.credentials.tracker_key]" in dump
    assert TRACKER_KEY not in dump


def _cached_names(def_id: str) -> list[str]:
    row = DiscoveredTools.objects.filter(def_id=def_id).first()
    return [t["name"] for t in row.tools] if row is not None else []


def test_a_server_at_a_private_address_is_refused_unless_allowlisted(
    stack: WorkerPool, loopback: tuple[int, Recorder], mcp_net: Any
) -> None:
    port, recorder = loopback
    overlay = {"transport": "streamable-http", "url": f"http://127.0.0.1:{port}/mcp"}
    refusal = "'127.0.0.1' resolves to 127.0.0.1, a loopback address"
    with pytest.raises(Refused, match=refusal):  # an IP literal is checked at registration, discovery or not
        mcpserver_op("acme", {"op": "create", "name": "private", "overlay": overlay, "discover": False})
    assert recorder.authorizations("127.0.0.1") == set()  # nothing was sent

    # Allowlisted in this process, registration and discovery reach it; the workers' allowlist still refuses the call.
    conf = mcp_net.LOOMCYCLE
    mcp_net.LOOMCYCLE = dataclasses.replace(conf, http_private_host_allowlist=("localhost", "127.0.0.1"))
    again = mcpserver_op("acme", {"op": "create", "name": "private", "overlay": overlay})["discovery"]
    assert again["ok"] and "echo" in again["tools"]
    recorder.seen.clear()
    done = run([{"tool": "mcp__private__echo", "input": {"text": "x"}}, {"text": "done"}])
    wait_status(done.id, RunStatus.COMPLETED, timeout=60)
    refused = results(done.id)["mcp__private__echo"]
    assert refused["error"] and refusal in refused["text"]
    assert recorder.authorizations("127.0.0.1") == set()


def test_rest_registration_discovers_and_rediscover_is_tenant_scoped(
    loopback: tuple[int, Recorder], http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    port, _ = loopback
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    body = {"op": "create", "name": "rest-loopback", "overlay": overlay}
    created = http.post("/v1/_mcpserverdef", headers=people["alice"], json=body)
    assert created.status_code == 200, created.text
    assert created.json()["discovery"]["ok"] and "echo" in created.json()["discovery"]["tools"]
    rediscover = {"op": "rediscover", "name": "rest-loopback"}
    again = http.post("/v1/_mcpserverdef", headers=people["alice"], json=rediscover)
    assert again.status_code == 200 and again.json()["def_id"] == created.json()["def_id"]
    other = http.post("/v1/_mcpserverdef", headers=people["charlie"], json=rediscover)
    assert other.status_code == 404 and other.json()["code"] == "not_found"


def test_cancelling_a_run_abandons_its_mcp_call(stack: WorkerPool, loopback: tuple[int, Recorder]) -> None:
    port, _ = loopback
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    assert mcpserver_op("acme", {"op": "create", "name": "slow", "overlay": overlay})["discovery"]["ok"]
    WAITING.clear()
    started = run([{"tool": "mcp__slow__wait", "input": {"seconds": 120}}, {"text": "never"}])
    assert WAITING.wait(60)
    run_services.run_cancel(principal=ACME, agent_id=started.agent_id, reason="test cancel")
    done = wait_status(started.id, RunStatus.CANCELLED, timeout=15)  # far below the call's 120 s
    assert "waited" not in json.dumps(list(results(done.id).values()))
