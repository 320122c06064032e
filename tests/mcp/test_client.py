"""The MCP client in this process: the stdio pool restarts a killed server, the
registry offers a tenant exactly its servers' cached tools under the usual policy,
and on_complete `mcp.call` hooks call tools. No worker runs here."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import threading
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from django.urls import reverse
from mcp.shared.exceptions import MCPError

from apps.core import toolregistry as registry
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.mcp import selectors, services
from apps.mcp.client import calls
from apps.mcp.client.servers import ServerSpec, server_spec
from apps.mcp.client.sessions import gone
from apps.mcp.server.http import _Manager
from apps.substrate.kinds import Refused, get_kind
from apps.substrate.services import Author, def_dispatch
from apps.triggers.models import OnCompleteJob
from apps.triggers.oncomplete import oncomplete_run
from tests.conftest import wait_for
from tests.mcp.conftest import mcpserver_op
from tests.mcp.servers import Recorder

pytestmark = pytest.mark.usefixtures("agents", "mcp_net")


def time_servers() -> list[int]:
    """The pids of this process's live mcp_server_time children."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"mcp_server_time" not in (proc / "cmdline").read_bytes():
                continue
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # it ended while we looked
            continue
        if ppid == os.getpid():
            out.append(int(proc.name))
    return out


def test_a_killed_stdio_server_is_restarted_on_the_next_call() -> None:
    row = selectors.server_resolve(tenant_id="", name="time")
    assert row is not None
    spec = server_spec(row, credentials={})
    first = calls.call_tool(spec, "get_current_time", {"timezone": "UTC"})
    assert not first.is_error and '"timezone": "UTC"' in calls.result_text(first)
    [pid] = time_servers()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: pid not in time_servers())
    again = calls.call_tool(spec, "convert_time", {"source_timezone": "UTC", "time": "08:30", "target_timezone": "UTC"})
    assert not again.is_error and '"datetime": ' in calls.result_text(again)
    [restarted] = time_servers()
    assert restarted != pid


def _server(tenant_id: str, name: str, listed: list[str], **extra: Any) -> None:
    """A server row (never reached) whose cache lists `listed`."""
    overlay = {"transport": "streamable-http", "url": "http://localhost:9/mcp", **extra}
    out = mcpserver_op(tenant_id, {"op": "create", "name": name, "overlay": overlay, "discover": False})
    row = selectors.server_resolve(tenant_id=tenant_id, name=name)
    assert row is not None and row.id == out["def_id"]
    tools = [{"name": t, "description": f"{t} tool", "input_schema": {"type": "object"}} for t in listed]
    services.discovered_tools_store(row=row, tools=tools)


def _tools(tenant_id: str, agent: list[str], caller: list[str] | None = None) -> list[str]:
    return registry.effective_tools(
        operator=["*"], agent=agent, caller=caller, disable_context=True, tenant_id=tenant_id
    )


def test_a_tenant_is_offered_its_own_and_shared_servers_tools_under_the_policy() -> None:
    _server("acme", "alpha", ["one", "two"])
    _server("acme", "narrow", ["keep", "drop"], tools=["keep"])
    _server("beta", "beta-only", ["secret"])
    _server("", "shared", ["common"])
    assert _tools("acme", ["mcp__*"]) == [
        "mcp__alpha__one",
        "mcp__alpha__two",
        "mcp__narrow__keep",
        "mcp__shared__common",
    ]  # the yaml `time` server offers nothing until it is discovered
    assert _tools("acme", ["mcp__alpha__*"]) == ["mcp__alpha__one", "mcp__alpha__two"]
    assert _tools("acme", ["mcp__alpha__*"], caller=["mcp__alpha__two", "mcp__shared__common"]) == ["mcp__alpha__two"]
    assert _tools("beta", ["mcp__*"]) == ["mcp__beta-only__secret", "mcp__shared__common"]
    assert registry.get("mcp__beta-only__secret", tenant_id="acme") is None
    assert registry.get("mcp__alpha__one") is None  # without a tenant, only registered tools
    tool = registry.get("mcp__alpha__one", tenant_id="acme")
    assert tool is not None and tool.description == "one tool"


def test_on_complete_mcp_call_hooks_call_the_tool_and_record_failures() -> None:
    hooks = [
        {"kind": "mcp.call", "server": "time", "tool": "get_current_time", "args": {"timezone": "UTC"}},
        {"kind": "mcp.call", "server": "time", "tool": "get_current_time", "args": {"timezone": "Nowhere/X"}},
        {"kind": "mcp.call", "server": "nowhere", "tool": "x"},
    ]
    OnCompleteJob.objects.create(run_id="run_mcp_hooks", tenant_id="acme", hooks=hooks)
    results = oncomplete_run("run_mcp_hooks", "completed")
    assert results is not None
    assert results[0] == {"kind": "mcp.call", "ok": True}
    assert not results[1]["ok"] and results[1]["error"].startswith("mcp_call_failed: ")
    assert "Invalid timezone" in results[1]["error"]
    assert results[2] == {
        "kind": "mcp.call",
        "ok": False,
        "error": "hook_target_missing: mcp server 'nowhere' not found",
    }


def test_a_provider_is_asked_only_when_every_layer_can_match_its_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def provider(tenant_id: str) -> list[Tool]:
        asked.append(tenant_id)
        return [Tool(name="zz__one", description="one", input_schema={"type": "object"}, execute=_never)]

    monkeypatch.setitem(registry._PROVIDERS, "zz__", [provider])
    assert _tools("acme", ["Read", "mcp__*"]) == ["Read"]
    assert _tools("acme", ["z*"], caller=["Read"]) == []
    assert asked == []
    assert _tools("acme", ["zz__*"]) == ["zz__one"]
    assert _tools("acme", ["*"], caller=["zz__one"]) == ["zz__one"]
    assert asked == ["acme", "acme"]


def _never(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    raise AssertionError("not called")


def test_the_admin_lists_each_servers_discovered_tools(admin_client: Any) -> None:
    _server("acme", "alpha", ["one", "two"])
    page = admin_client.get(reverse("admin:mcp_discoveredtools_changelist")).content.decode()
    assert "alpha" in page and "one, two" in page


def test_past_the_stdio_bound_the_least_recently_used_idle_server_is_stopped(mcp_net: Any) -> None:
    mcp_net.LOOMCYCLE = dataclasses.replace(mcp_net.LOOMCYCLE, mcp_max_stdio_processes=1)
    calls.shutdown()  # the next call starts this process's loop afresh, with the bound of 1
    row = selectors.server_resolve(tenant_id="", name="time")
    assert row is not None
    first = server_spec(row, credentials={})
    second = dataclasses.replace(first, def_id="def_another_version")
    assert not calls.call_tool(first, "get_current_time", {"timezone": "UTC"}).is_error
    [old] = time_servers()
    assert not calls.call_tool(second, "get_current_time", {"timezone": "UTC"}).is_error
    [new] = wait_for(lambda: (pids := time_servers()) and len(pids) == 1 and old not in pids and pids)
    assert new != old


def _children(marker: bytes) -> list[int]:
    """The pids of this process's live children whose command line holds `marker`."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or marker not in (proc / "cmdline").read_bytes():
                continue
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # it ended while we looked
            continue
        if ppid == os.getpid():
            out.append(int(proc.name))
    return out


def test_a_stdio_server_that_never_initializes_is_stopped_and_the_next_call_starts_afresh(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, mcp_call_timeout_seconds=1.0)
    spec = ServerSpec(def_id="mute", tenant_id="", name="mute", transport="stdio", command="sleep", args=("1017",))
    with pytest.raises(calls.McpCallFailed):
        calls.call_tool(spec, "anything", {})
    wait_for(lambda: not _children(b"1017"))  # its process is gone, not kept as a pooled session
    failures: list[Exception] = []
    second = threading.Thread(target=_call_into, args=(spec, failures))
    second.start()
    assert wait_for(lambda: _children(b"1017"))  # a fresh process for the next call
    second.join()
    assert [type(f) for f in failures] == [calls.McpCallFailed]
    wait_for(lambda: not _children(b"1017"))


def _call_into(spec: ServerSpec, failures: list[Exception]) -> None:
    try:
        calls.call_tool(spec, "anything", {})
    except calls.McpCallFailed as exc:
        failures.append(exc)


def test_rediscover_reaches_only_the_callers_own_servers_and_shared_ones_need_an_admin() -> None:
    with pytest.raises(Refused, match="only an admin may rediscover it"):
        mcpserver_op("acme", {"op": "rediscover", "name": "time"})  # the operator's shared yaml server
    admin = Author(tenant_id="acme", subject="root", is_admin=True)
    out = def_dispatch(get_kind("mcpserver"), admin, {"op": "rediscover", "name": "time"})
    assert out["ok"] and "get_current_time" in out["tools"]
    _server("acme", "own", ["one"])
    own = mcpserver_op("acme", {"op": "rediscover", "name": "own"})  # its own: allowed (port 9 refuses)
    assert own["name"] == "own" and not own["ok"]


def test_what_a_server_lists_is_made_storable_bounded_and_object_typed() -> None:
    _server("acme", "odd", [])
    row = selectors.server_resolve(tenant_id="acme", name="odd")
    assert row is not None
    listed = [
        {"name": "nul\x00name", "description": "bad \ud800 text", "input_schema": {"type": "object", "x": "\x00"}},
        {"name": "array", "description": "", "input_schema": {"type": "array"}},
        {"name": "huge", "description": "d" * 100_000, "input_schema": {"type": "object", "p": "y" * 70_000}},
        *({"name": f"t{i}", "description": "", "input_schema": {"type": "object"}} for i in range(300)),
    ]
    services.discovered_tools_store(row=row, tools=listed, error="refused \x00 \udfff")
    cached = selectors.discovered_for(def_ids=[row.id])[row.id]
    assert len(cached.tools) == services.MAX_TOOLS
    first, array, huge = cached.tools[:3]
    assert first == {
        "name": "nul\ufffdname",
        "description": "bad \\ud800 text",
        "input_schema": {"type": "object", "x": "\ufffd"},
    }
    assert array["input_schema"] == huge["input_schema"] == {"type": "object"}
    assert len(huge["description"]) == services.MAX_DESCRIPTION_CHARS
    assert cached.error == "refused \ufffd \\udfff"


def test_an_mcp_call_hook_whose_answer_is_not_storable_is_recorded_all_the_same(
    loopback: tuple[int, Recorder],
) -> None:
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{loopback[0]}/mcp"}
    mcpserver_op("acme", {"op": "create", "name": "garbler", "overlay": overlay, "discover": False})
    hooks = [{"kind": "mcp.call", "server": "garbler", "tool": "garble", "args": {}}]
    OnCompleteJob.objects.create(run_id="run_mcp_nul", tenant_id="acme", hooks=hooks)
    [result] = oncomplete_run("run_mcp_nul", "completed") or []
    assert not result["ok"] and result["error"] == "mcp_call_failed: Error executing tool garble: garbled \ufffd answer"
    job = OnCompleteJob.objects.get(run_id="run_mcp_nul")
    assert job.state == "done" and job.results == [result]


def test_a_tenants_http_server_obeys_the_network_floor_and_the_runs_allowed_hosts(
    loopback: tuple[int, Recorder], mcp_net: Any
) -> None:
    port, recorder = loopback
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    mcpserver_op("acme", {"op": "create", "name": "floor", "overlay": overlay, "discover": False})
    row = selectors.server_resolve(tenant_id="acme", name="floor")
    assert row is not None
    recorder.seen.clear()
    narrowed = services.mcp_call(row=row, tool="echo", args={"text": "x"}, credentials={}, allowed_hosts=())
    assert narrowed.is_error and "is not within this run's allowed_hosts" in narrowed.text
    elsewhere = ("example.com",)
    assert services.mcp_call(row=row, tool="echo", args={"text": "x"}, credentials={}, allowed_hosts=elsewhere).is_error
    allowed = services.mcp_call(row=row, tool="echo", args={"text": "x"}, credentials={}, allowed_hosts=("localhost",))
    assert (allowed.text, allowed.is_error) == ("echo: x", False)
    recorder.seen.clear()

    mcp_net.LOOMCYCLE = dataclasses.replace(mcp_net.LOOMCYCLE, http_host_allowlist=())  # network not configured
    refused = services.mcp_call(row=row, tool="echo", args={"text": "x"}, credentials={})
    assert refused.is_error and "not reachable while the network is not configured" in refused.text
    discovery = mcpserver_op("acme", {"op": "rediscover", "name": "floor"})
    assert not discovery["ok"] and "LOOMCYCLE_HTTP_HOST_ALLOWLIST" in discovery["error"]
    assert recorder.seen == []  # nothing was sent


def test_the_mcp_endpoints_session_manager_is_started_again_after_its_task_ends() -> None:
    async def restarted() -> bool:
        manager = _Manager()
        first = await manager.started()
        task = manager._task
        assert task is not None
        task.cancel()  # its task group ended (as a failure would end it)
        await asyncio.wait([task])
        second = await manager.started()
        return second is not first and manager._task is not None and not manager._task.done()

    assert asyncio.run(restarted())


def _loopback_server(name: str, port: int) -> Any:
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    mcpserver_op("acme", {"op": "create", "name": name, "overlay": overlay, "discover": False})
    row = selectors.server_resolve(tenant_id="acme", name=name)
    assert row is not None
    return row


def test_an_http_session_the_server_forgot_is_opened_again_once_and_the_call_answered(
    loopback: tuple[int, Recorder],
) -> None:
    port, recorder = loopback
    row = _loopback_server("forgetful", port)
    recorder.requests.clear()
    first = services.mcp_call(row=row, tool="echo", args={"text": "one"}, credentials={})
    assert (first.text, first.is_error) == ("echo: one", False)
    [before] = recorder.calls("tools/call")
    recorder.expire()  # the server forgets the session, as one whose idle timeout ran out
    again = services.mcp_call(row=row, tool="echo", args={"text": "two"}, credentials={})
    assert (again.text, again.is_error) == ("echo: two", False)
    tool_calls = recorder.calls("tools/call")
    assert [(c.session == before.session, c.status) for c in tool_calls] == [(True, 200), (True, 404), (False, 200)]
    assert len(recorder.calls("initialize")) == 2  # the pooled session, then the one opened again
    assert tool_calls[2].session != ""


def test_a_server_that_keeps_forgetting_its_session_gives_an_error_result_after_one_retry(
    loopback: tuple[int, Recorder],
) -> None:
    port, recorder = loopback
    row = _loopback_server("amnesiac", port)
    recorder.requests.clear()
    recorder.expire(always=True)
    try:
        out = services.mcp_call(row=row, tool="echo", args={"text": "x"}, credentials={})
    finally:
        recorder.expiring = ""
    assert out.is_error and out.text == "mcp server 'amnesiac': tool 'echo' failed: Session not found"
    assert [c.status for c in recorder.calls("tools/call")] == [404, 404]
    assert len(recorder.calls("initialize")) == 2


def test_only_an_expired_session_or_a_closed_connection_counts_as_gone() -> None:
    """The classification behind the one re-initialise: a call whose error merely mentions a
    session is the call's own failure and is not sent again (a tool would run twice)."""
    assert gone(MCPError(mcp_types.INVALID_REQUEST, "Session not found"))  # the SDK server's 404
    assert gone(MCPError(mcp_types.INVALID_REQUEST, "Session terminated"))  # the SDK client's bare 404
    assert gone(MCPError(mcp_types.CONNECTION_CLOSED, "Connection closed"))
    assert not gone(MCPError(mcp_types.INTERNAL_ERROR, "the upstream session with the tracker was lost"))
    assert not gone(MCPError(mcp_types.INVALID_PARAMS, "session_id must be a string"))
