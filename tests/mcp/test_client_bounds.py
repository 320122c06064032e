"""What the MCP client reads of a server is bounded (issue 33): a tenant's server that
answers with a gzip bomb or an oversized body, against the SDK-built loopback server
behind `Hostile` (tests/mcp/servers.py). Discovery (which runs in the web process on
create) and a run's tool call (on a real worker) fail with a clear reason; the process
lives on with its memory bounded. And discovery over REST waits on the event loop, holding
none of the web process's threads."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import resource
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client import Client

from apps.core.types import Principal
from apps.mcp import selectors as mcp_selectors
from apps.mcp.client import calls
from apps.mcp.client.servers import server_spec
from apps.mcp.client.sessions import MAX_LIST_PAGES, MAX_TOOLS
from apps.runs import services as run_services
from apps.runs.models import RunEvent, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import daphne, wait_for, wait_status
from tests.factories.mcp import call, over_http
from tests.mcp.conftest import mcpserver_op
from tests.mcp.servers import Hostile, gzip_bomb, hostile_serving
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "mcp_net")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
BOMB_INFLATED = 256 * 1024 * 1024  # a quarter GiB of zeros in about 256 KiB of gzip
CAP = 256 * 1024  # this process's LOOMCYCLE_MCP_MAX_RESPONSE_BYTES in the discovery tests
WORKER_CAP = 4 * 1024 * 1024  # the workers' (the default)


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[int, Hostile]]:
    with hostile_serving() as (port, server):
        server.bomb = gzip_bomb(BOMB_INFLATED)
        yield port, server


@pytest.fixture
def server(hostile: tuple[int, Hostile]) -> Iterator[Hostile]:
    hostile[1].answered.clear()
    hostile[1].encodings.clear()
    yield hostile[1]
    hostile[1].mode = ""


def _overlay(port: int) -> dict[str, Any]:
    return {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


REFUSED = {
    "gzip": "the MCP server sent a 'gzip'-encoded reply; this client accepts identity only",
    "huge": f"the MCP server's reply exceeds {CAP} bytes",
    "huge-sse": f"Server-sent event exceeded the {CAP} byte limit",
}


@pytest.mark.parametrize("mode", sorted(REFUSED))
def test_discovery_refuses_a_reply_it_must_not_read(
    hostile: tuple[int, Hostile], server: Hostile, mode: str, mcp_net: Any
) -> None:
    mcp_net.LOOMCYCLE = dataclasses.replace(mcp_net.LOOMCYCLE, mcp_max_response_bytes=CAP)
    server.mode, server.method, server.size = mode, "tools/list", 2 * CAP
    peak = _peak_rss_bytes()
    created = mcpserver_op("acme", {"op": "create", "name": f"hostile-{mode}", "overlay": _overlay(hostile[0])})
    discovery = created["discovery"]
    assert discovery["ok"] is False and REFUSED[mode] in discovery["error"], discovery
    assert server.answered == [mode]
    assert server.encodings and set(server.encodings) == {"identity"}  # it never asked for a compressed reply
    assert _peak_rss_bytes() - peak < 64 * 1024 * 1024  # the bomb was never inflated


def test_a_server_that_pages_tools_list_forever_fails_discovery_after_the_page_cap(
    hostile: tuple[int, Hostile], server: Hostile, mcp_net: Any
) -> None:
    """Empty pages, each with a next cursor: read up to MAX_LIST_PAGES, then the discovery
    fails naming the cap (before: read until the discovery timeout, memory growing)."""
    mcp_net.LOOMCYCLE = dataclasses.replace(mcp_net.LOOMCYCLE, mcp_discovery_timeout_seconds=20.0)
    server.mode, server.method, server.size = "paging", "tools/list", 0
    started = time.monotonic()
    created = mcpserver_op("acme", {"op": "create", "name": "endless", "overlay": _overlay(hostile[0])})
    discovery = created["discovery"]
    assert discovery["ok"] is False, discovery
    assert f"still paging tools/list after {MAX_LIST_PAGES} pages" in discovery["error"], discovery
    assert server.answered == ["paging"] * MAX_LIST_PAGES
    assert time.monotonic() - started < 10  # ended by the cap, not by the 20 s discovery timeout


def test_a_server_that_pages_tools_forever_is_read_up_to_max_tools_and_no_further(
    hostile: tuple[int, Hostile], server: Hostile
) -> None:
    """Pages of 100 tools without end: reading stops at MAX_TOOLS (3 pages), the first kept."""
    server.mode, server.method, server.size = "paging", "tools/list", 100
    created = mcpserver_op("acme", {"op": "create", "name": "endless-tools", "overlay": _overlay(hostile[0])})
    discovery = created["discovery"]
    assert discovery["ok"] is True, discovery
    assert len(discovery["tools"]) == MAX_TOOLS and discovery["tools"][:2] == ["p0_0", "p0_1"]
    assert server.answered == ["paging"] * 3


def test_a_bug_in_discovery_is_raised_not_stored_as_the_servers_failure(
    hostile: tuple[int, Hostile], server: Hostile
) -> None:
    """Only what a server, the network or the protocol can cause is a discovery's stored failure:
    a spec missing its SSRF policy (a bug of this code, never a server's doing) propagates from
    both entry points instead of becoming `ok: false`, "AssertionError"."""
    mcpserver_op("acme", {"op": "create", "name": "buggy", "overlay": _overlay(hostile[0]), "discover": False})
    row = mcp_selectors.server_resolve(tenant_id="acme", name="buggy")
    assert row is not None
    spec = dataclasses.replace(server_spec(row, credentials=None), policy=None)
    with pytest.raises(AssertionError):
        calls.list_tools(spec)
    with pytest.raises(AssertionError):
        asyncio.run(calls.alist_tools(spec))
    honest = server_spec(row, credentials=None)
    assert [t["name"] for t in asyncio.run(calls.alist_tools(honest))][:1] == ["echo"]  # the same path, no bug


def _call_echo(name: str) -> dict[str, Any]:
    script = [{"tool": f"mcp__{name}__echo", "input": {"text": "hi"}}, {"text": "done"}]
    prompt = f"Use the tools. MOCK_SCRIPT: {json.dumps(script)}"
    data = run_services.RunCreate(agent="mcp-user", segments=[Segment(text=prompt)])
    run = run_services.run_create(principal=ACME, data=data)
    wait_status(run.id, RunStatus.COMPLETED, timeout=90)
    event = RunEvent.objects.get(run_id=run.id, type="tool_result")
    return {"text": event.payload["text"], "error": event.payload["is_error"]}


def test_a_worker_answers_a_hostile_tool_reply_with_an_error_result_and_lives_on(
    stack: WorkerPool, hostile: tuple[int, Hostile], server: Hostile
) -> None:
    created = mcpserver_op("acme", {"op": "create", "name": "turncoat", "overlay": _overlay(hostile[0])})
    assert created["discovery"]["ok"], created  # honest at discovery, hostile at call time
    workers = set(stack.pids())
    expected = {"gzip": REFUSED["gzip"], "huge": f"the MCP server's reply exceeds {WORKER_CAP} bytes"}
    for mode, says in expected.items():
        server.mode, server.method, server.size = mode, "tools/call", WORKER_CAP + 1024
        result = _call_echo("turncoat")
        assert result["error"] and says in result["text"], result
    server.mode = ""
    assert _call_echo("turncoat") == {"text": "echo: hi", "error": False}  # the same worker pool, serving on
    assert set(stack.pids()) == workers
    assert set(server.answered) == {"gzip", "huge"}


@pytest.fixture(scope="module")
def two_thread_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """A web process whose executor has 2 threads whatever the CPU count (daphne reads ASGI_THREADS)."""
    with daphne(stack_env, logdir, "daphne-mcp-2-threads", ASGI_THREADS="2") as base:
        yield base


Register = Callable[[str, dict[str, str], dict[str, Any]], dict[str, Any]]


def _over_rest(base: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{base}/v1/_mcpserverdef", headers=headers, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    out: dict[str, Any] = answer.json()
    return out


def _over_mcp(base: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """The `mcpserverdef` tool of the web process's MCP server (`/v1/_mcp`), with the SDK's client."""

    async def work(client: Client) -> tuple[bool, dict[str, Any]]:
        return await call(client, "mcpserverdef", body)

    error, out = over_http(base, headers, work)
    assert not error, out
    return out


def _slow_registrations_leave_a_thread_free(
    base: str, port: int, server: Hostile, headers: dict[str, str], register: Register, prefix: str
) -> None:
    """Six registrations whose server takes 3 s to list its tools, on a web process with 2
    executor threads: if each discovery held a thread, a request needing one (the def names)
    would queue behind them for 3 s or more; awaited on the event loop, it answers at once,
    and every registration still answers with its discovery."""
    server.mode, server.method, server.delay = "slow", "tools/list", 3.0
    httpx.get(f"{base}/v1/_agentdef/names", headers=headers, timeout=30)  # the token now cached
    bodies = [{"op": "create", "name": f"{prefix}-{i}", "overlay": _overlay(port)} for i in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = [pool.submit(register, base, headers, body) for body in bodies]
        wait_for(lambda: server.answered.count("slow") >= 2, timeout=30)  # discoveries under way
        started = time.monotonic()
        names = httpx.get(f"{base}/v1/_agentdef/names", headers=headers, timeout=30)
        waited = time.monotonic() - started
        created = [a.result(timeout=60) for a in answers]
    assert names.status_code == 200 and waited < 1.5, waited
    assert all(c["discovery"]["ok"] for c in created), created


def test_discovery_over_rest_holds_none_of_the_web_processes_threads(
    two_thread_web: str, hostile: tuple[int, Hostile], server: Hostile, people: dict[str, dict[str, str]]
) -> None:
    _slow_registrations_leave_a_thread_free(two_thread_web, hostile[0], server, people["alice"], _over_rest, "slow")


def test_discovery_over_the_mcp_server_holds_none_of_the_web_processes_threads(
    two_thread_web: str, hostile: tuple[int, Hostile], server: Hostile, people: dict[str, dict[str, str]]
) -> None:
    """The same over `/v1/_mcp`: its `mcpserverdef` tool awaits the same service entry as REST."""
    _slow_registrations_leave_a_thread_free(two_thread_web, hostile[0], server, people["alice"], _over_mcp, "slow-mcp")
