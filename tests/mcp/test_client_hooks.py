"""Tool-use hooks wrap MCP tools as they wrap built-ins (docs/mcp.md, Naming and policy):
a pre hook registered over REST for `mcp__loopback__echo` denies a run's call, the run's
tool result is the deny, and the MCP server (tests/mcp/servers.py, on a loopback port)
never receives the call. Real Daphne, Celery workers, Postgres and Redis; the hook's
callback is a loopback server speaking the wire (tests/triggers/hookserver.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services as run_services
from apps.runs.models import RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.triggers.hooks import cache
from apps.triggers.models import HookRegistration
from tests.conftest import wait_status
from tests.mcp.conftest import mcpserver_op
from tests.mcp.servers import Recorder
from tests.procs import WorkerPool
from tests.triggers.hookserver import HookServer, hook_server, reply

pytestmark = pytest.mark.usefixtures("agents", "mcp_net")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


@pytest.fixture
def hooks() -> Iterator[HookServer]:
    """The callback server; the test's registrations are gone afterwards, in every process."""
    with hook_server() as server:
        yield server
    HookRegistration.objects.all().delete()
    cache.bump()


def test_a_pre_hook_denies_an_mcp_call_and_the_server_never_gets_it(
    stack: WorkerPool, web: str, people: dict[str, dict[str, str]], loopback: tuple[int, Recorder], hooks: HookServer
) -> None:
    port, recorder = loopback
    overlay = {"transport": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    created = mcpserver_op("acme", {"op": "create", "name": "loopback", "overlay": overlay})
    assert created["discovery"]["ok"] and "echo" in created["discovery"]["tools"]

    # The callback is addressed as `localhost`, the one name the stack may reach on loopback.
    url = hooks.on("/deny", reply({"deny": {"text": "echo is off limits"}})).replace("127.0.0.1", "localhost")
    hook = {"owner": "sec", "name": "gate", "phase": "pre", "tools": ["mcp__loopback__echo"], "callback_url": url}
    registered = httpx.post(web + "/v1/hooks", json=hook, headers=people["alice"], timeout=30)
    assert registered.status_code == 200, registered.text
    recorder.requests.clear()

    steps = [{"tool": "mcp__loopback__echo", "input": {"text": "hi"}}, {"text": "done"}]
    prompt = f"Use the tools. MOCK_SCRIPT: {json.dumps(steps)}"
    run = run_services.run_create(
        principal=ACME, data=run_services.RunCreate(agent="mcp-user", segments=[Segment(text=prompt)])
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=60)

    (result,) = [e.payload for e in RunEvent.objects.filter(run_id=run.id, type="tool_result")]
    assert result["tool_use"]["name"] == "mcp__loopback__echo"
    assert (result["text"], result["is_error"]) == ("echo is off limits", True)
    assert RunEvent.objects.filter(run_id=run.id, type="hook_deny").count() == 1
    (asked,) = hooks.calls("/deny")
    assert asked["tool_call"]["name"] == "mcp__loopback__echo" and asked["tool_call"]["input"] == {"text": "hi"}
    assert recorder.calls("tools/call") == []  # the server never got the call
