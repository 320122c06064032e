"""Tool-use hooks (SPEC 2.9, 9.3) end to end: registrations through a real
Daphne, runs executed by real Celery workers (the `mock-script` model makes
the tool calls), callbacks answered by a loopback server speaking the wire.
Deny, rewrites, chain order, timeouts and 5xx under both fail modes, tenant
confinement, cross-process invalidation, and the registration API's 4xx."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import current_app
from django.db import transaction

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment
from apps.substrate import tokens
from apps.triggers.hooks import cache, callback
from apps.triggers.hooks import services as hook_services
from apps.triggers.hooks.types import Hook
from apps.triggers.models import HookFailMode, HookPhase, HookRegistration
from tests import procs
from tests.conftest import wait_for, wait_status
from tests.triggers.hookserver import HookServer, hold, hook_server, reply

pytestmark = pytest.mark.usefixtures("agents")

HOOK_ENV = {
    "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST": "127.0.0.1",  # the callback server (and the test page) on loopback
    # The operator's list bounds hook callbacks: it holds the callback server (loopback) and the
    # registrations' example host. Runs created in this process get their host list from its settings
    # ("allowed.test" where a test needs the HTTP tool): loopback stays outside it unless a hook widens it.
    "LOOMCYCLE_HTTP_HOST_ALLOWLIST": "allowed.test,127.0.0.1,hooks.example.com",
    "LOOMCYCLE_HOOKS_PERMIT_HOST_WIDEN": "acme:net",  # tenant acme's owner `net` may widen hosts
}
CONTEXT_SELF = [{"tool": "Context", "input": {"op": "self"}}, {"text": "done"}]
DEPLOYMENT = Principal(tenant_id="", subject="root", scopes=frozenset({"substrate:admin"}))
PAYLOAD_KEYS = {"phase", "owner", "hook_name", "agent", "user_id", "agent_id", "run_id", "tool_call"}


@pytest.fixture(scope="module")
def hook_web(workers: procs.WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """Daphne and two Celery workers with HOOK_ENV; the session's workers are
    stopped meanwhile, so every run here executes under it. Yields the web URL."""
    workers.stop()
    env = {**stack_env, **HOOK_ENV}
    pool = procs.WorkerPool(env, logdir / "hooks")
    pool.ensure()
    port = procs.free_port()
    daphne = procs.web_argv(port)
    web = procs.spawn(daphne, env, logdir / "hooks" / "daphne.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthz")
        wait_for(lambda: len(current_app.control.ping(timeout=1) or []) >= len(pool.pids()), timeout=60)
        yield base
    finally:
        procs.stop(web)
        pool.stop()
        workers.ensure()


@pytest.fixture(autouse=True)
def _no_hooks_left(agents: None) -> Iterator[None]:
    """Each test starts and ends with no registration, and every process knows it
    (the flush between tests deletes rows behind the services' backs)."""
    HookRegistration.objects.all().delete()
    cache.bump()
    yield
    HookRegistration.objects.all().delete()
    cache.bump()


@pytest.fixture
def server() -> Iterator[HookServer]:
    with hook_server() as srv:
        yield srv


@pytest.fixture
def clients(hook_web: str, people: dict[str, dict[str, str]]) -> Iterator[dict[str, httpx.Client]]:
    """alice (acme) and charlie (beta) with substrate:tenant, bob (acme, runs only), ops (admin, tenant ops)."""
    ops = tokens.token_create(name="hooks-ops", tenant_id="ops", subject="ops", scopes=["substrate:admin"])["token"]
    headers = {**people, "ops": {"authorization": f"Bearer {ops}"}}
    opened = {who: httpx.Client(base_url=hook_web, headers=h, timeout=30) for who, h in headers.items()}
    try:
        yield opened
    finally:
        for client in opened.values():
            client.close()


def register(client: httpx.Client, **body: Any) -> str:
    resp = client.post("/v1/hooks", json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def hook(url: str, name: str, phase: str = "pre", **extra: Any) -> dict[str, Any]:
    return {"owner": "sec", "name": name, "phase": phase, "tools": ["Context"], "callback_url": url, **extra}


def scripted(steps: list[dict[str, Any]], tenant: str = "acme", agent: str = "scripted") -> str:
    principal = Principal(tenant_id=tenant, subject="u1", scopes=frozenset({"substrate:tenant"}))
    data = services.RunCreate(agent=agent, segments=[Segment(text=f"MOCK_SCRIPT: {json.dumps(steps)}")])
    run = services.run_create(principal=principal, data=data)
    wait_status(run.id, RunStatus.COMPLETED, timeout=60)
    return run.id


def events(run_id: str, *types: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, type__in=types).order_by("seq")
    return [{"type": e.type, **e.payload} for e in rows]


def tool_result(run_id: str) -> dict[str, Any]:
    (result,) = events(run_id, "tool_result")
    return result


# --- the pre chain ------------------------------------------------------------------------


def test_a_pre_hook_denies_the_call_with_a_synthetic_result(server: HookServer, clients: dict[str, Any]) -> None:
    url = server.on("/deny", reply({"deny": {"text": "Context is off limits today"}}))
    hook_id = register(clients["alice"], **hook(url, "gate"))
    run_id = scripted(CONTEXT_SELF)
    result = tool_result(run_id)
    assert (result["text"], result["is_error"]) == ("Context is off limits today", True)
    (deny,) = events(run_id, "hook_deny")
    assert deny["hook"] == {
        "hook_id": hook_id,
        "owner": "sec",
        "name": "gate",
        "phase": "pre",
        "tool_call_id": result["tool_use"]["id"],
        "tool_name": "Context",
        "text": "Context is off limits today",
        "is_error": True,
    }
    (payload,) = server.calls("/deny")
    assert set(payload) == PAYLOAD_KEYS  # the call, never the prompt or the history
    assert payload["tool_call"] == {"id": result["tool_use"]["id"], "name": "Context", "input": {"op": "self"}}
    assert (payload["phase"], payload["agent"], payload["run_id"]) == ("pre", "scripted", run_id)


def test_a_pre_hook_rewrites_the_input_the_tool_runs_with(server: HookServer, clients: dict[str, Any]) -> None:
    url = server.on("/rewrite", reply({"input": {"op": "time"}}))
    register(clients["alice"], **hook(url, "rewrite"))
    run_id = scripted(CONTEXT_SELF)
    result = tool_result(run_id)
    assert not result["is_error"]
    assert json.loads(result["text"])["timezone"] == "UTC"  # op=time answered, not op=self
    (rewrite,) = events(run_id, "hook_rewrite")
    assert (rewrite["hook"]["phase"], rewrite["hook"]["input"]) == ("pre", {"op": "time"})


def test_a_post_hook_rewrites_the_result_the_model_reads(server: HookServer, clients: dict[str, Any]) -> None:
    url = server.on("/redact", reply({"result": {"text": "[redacted by policy]"}}))
    register(clients["alice"], **hook(url, "redact", phase="post"))
    run_id = scripted(CONTEXT_SELF)
    assert (tool_result(run_id)["text"], tool_result(run_id)["is_error"]) == ("[redacted by policy]", False)
    (payload,) = server.calls("/redact")
    assert set(payload) == PAYLOAD_KEYS | {"tool_result"}
    assert json.loads(payload["tool_result"]["text"])["run_id"] == run_id  # the post hook saw the real result
    blocks = [b for row in TranscriptEntry.objects.filter(run_id=run_id) for b in row.content]
    (block,) = [b for b in blocks if b.get("type") == "tool_result"]
    assert block["content"] == "[redacted by policy]"  # what the next model call reads


def test_pre_hooks_run_in_registration_order_and_post_hooks_in_reverse(
    server: HookServer, clients: dict[str, Any]
) -> None:
    alice = clients["alice"]
    first = register(alice, **hook(server.on("/pre1", reply({"input": {"op": "time"}})), "pre1"))
    register(alice, **hook(server.on("/post1", reply({})), "post1", phase="post"))
    register(alice, **hook(server.on("/pre2", reply(None, 204)), "pre2"))
    register(alice, **hook(server.on("/post2", reply({})), "post2", phase="post"))
    scripted(CONTEXT_SELF)
    assert server.order() == ["/pre1", "/pre2", "/post2", "/post1"]
    (second_saw,) = server.calls("/pre2")
    assert second_saw["tool_call"]["input"] == {"op": "time"}  # the first hook's rewrite
    replaced = register(alice, **hook(server.url("/pre1"), "pre1", timeout_ms=2000))  # replace in place
    assert replaced != first
    listed = alice.get("/v1/hooks").json()["hooks"]
    assert [h["name"] for h in listed] == ["pre1", "post1", "pre2", "post2"]
    assert (listed[0]["id"], listed[0]["timeout_ms"]) == (replaced, 2000)
    server.received.clear()
    scripted(CONTEXT_SELF)
    assert server.order() == ["/pre1", "/pre2", "/post2", "/post1"]  # it kept its place in the chain


@pytest.mark.parametrize("owner", ["net", "sec"])
def test_allow_hosts_widens_the_call_only_for_a_permitted_owner(
    server: HookServer, clients: dict[str, Any], owner: str, settings: Any
) -> None:
    # Runs are created in this process: their host list comes from its settings (as the web's would).
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=("allowed.test",))
    page = server.on("/page", reply({"page": "reached"}))
    widen = server.on("/widen", reply({"allow_hosts": ["127.0.0.1"]}))
    register(clients["alice"], **hook(widen, "widen", owner=owner, tools=["HTTP"]))
    call = {"tool": "HTTP", "input": {"method": "POST", "url": page, "body": "{}"}}
    run_id = scripted([call, {"text": "done"}], agent="fetcher")
    result = tool_result(run_id)
    widened = events(run_id, "host_widened")
    if owner == "net":  # permitted: this one call may reach the loopback page
        assert not result["is_error"] and result["text"].startswith(f"HTTP POST {page} -> 200")
        assert '{"page": "reached"}' in result["text"]
        (event,) = widened
        assert event["host_widening"] == {
            "tool_call_id": result["tool_use"]["id"],
            "tool_name": "HTTP",
            "url": page,
            "hook_owner": "net",
            "hook_name": "widen",
            "hosts_added": ["127.0.0.1"],
        }
    else:  # not permitted: ignored, and the run's own host list refuses the page
        assert result["is_error"] and "not in the allowed hosts" in result["text"], result["text"]
        assert widened == [] and server.calls("/page") == []


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_callback_past_its_timeout_fails_by_its_mode(
    server: HookServer, clients: dict[str, Any], fail_mode: str
) -> None:
    url = server.on("/slow", hold(server))
    register(clients["alice"], **hook(url, "slow", timeout_ms=300, fail_mode=fail_mode))
    run_id = scripted(CONTEXT_SELF)
    server.release.set()
    _assert_failed_by_mode(run_id, fail_mode, "timed out after 300 ms")


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_5xx_fails_by_its_mode(server: HookServer, clients: dict[str, Any], fail_mode: str) -> None:
    url = server.on("/broken", reply({"error": "boom"}, 503))
    register(clients["alice"], **hook(url, "broken", fail_mode=fail_mode))
    run_id = scripted(CONTEXT_SELF)
    _assert_failed_by_mode(run_id, fail_mode, "answered HTTP 503")


def _assert_failed_by_mode(run_id: str, fail_mode: str, reason: str) -> None:
    result = tool_result(run_id)
    (error,) = events(run_id, "hook_error")
    assert error["hook"]["fail_mode"] == fail_mode and reason in error["hook"]["error"]
    if fail_mode == "open":  # passed through: the tool ran with its own input
        assert not result["is_error"] and json.loads(result["text"])["run_id"] == run_id
    else:
        assert result["is_error"] and "fails closed" in result["text"] and reason in result["text"]


# --- who sees what ----------------------------------------------------------------------------


def test_a_tenant_hook_fires_only_on_its_tenant_runs_and_a_global_one_on_all(
    server: HookServer, clients: dict[str, Any], settings: Any
) -> None:
    register(clients["alice"], **hook(server.on("/acme", reply({})), "acme-only"))
    # The deployment's own tenant (""): its admin is the legacy token or open mode, so in-process here.
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("127.0.0.1",))
    spec = hook_services.hook_spec(hook(server.on("/global", reply({})), "everyone"))
    hook_services.hook_register(principal=DEPLOYMENT, spec=spec)
    beta_run = scripted(CONTEXT_SELF, tenant="beta")
    assert [p["run_id"] for p in server.calls("/global")] == [beta_run]
    assert server.calls("/acme") == []  # tenant acme's hook never saw beta's run
    acme_run = scripted(CONTEXT_SELF, tenant="acme")
    assert [p["run_id"] for p in server.calls("/acme")] == [acme_run]
    assert [p["run_id"] for p in server.calls("/global")] == [beta_run, acme_run]
    assert [h["name"] for h in clients["charlie"].get("/v1/hooks").json()["hooks"]] == []
    assert [h["name"] for h in clients["alice"].get("/v1/hooks").json()["hooks"]] == ["acme-only"]


def test_hooks_match_agents_and_tool_globs(server: HookServer, clients: dict[str, Any]) -> None:
    alice = clients["alice"]
    register(alice, **hook(server.on("/glob", reply({})), "glob", tools=["Cont*"]))
    register(alice, **hook(server.on("/other-tool", reply({})), "other-tool", tools=["Channel"]))
    register(alice, **hook(server.on("/other-agent", reply({})), "other-agent", agents=["someone-else"]))
    scripted(CONTEXT_SELF)
    assert server.order() == ["/glob"]


def test_a_registration_in_web_reaches_the_workers_next_call(server: HookServer, clients: dict[str, Any]) -> None:
    url = server.on("/late", reply({"deny": {"text": "now denied"}}))
    before = scripted(CONTEXT_SELF)  # the workers have loaded (and cached) an empty registry
    assert not tool_result(before)["is_error"] and server.calls() == []
    hook_id = register(clients["alice"], **hook(url, "late"))
    during = scripted(CONTEXT_SELF)
    assert tool_result(during)["text"] == "now denied"
    assert clients["alice"].delete(f"/v1/hooks/{hook_id}").json() == {"deleted": hook_id}
    after = scripted(CONTEXT_SELF)
    assert not tool_result(after)["is_error"] and len(server.calls()) == 1


# --- the registration API ---------------------------------------------------------------------

BAD = [
    ({"owner": ""}, "owner"),
    ({"owner": "a b"}, "owner"),
    ({"name": None}, "name"),
    ({"phase": "during"}, "phase"),
    ({"agents": []}, "agents"),
    ({"agents": ["pre*"]}, "agents"),
    ({"tools": ["a*b"]}, "tools"),
    ({"tools": "Context"}, "tools"),
    ({"fail_mode": "maybe"}, "fail_mode"),
    ({"timeout_ms": 0}, "timeout_ms"),
    ({"timeout_ms": 60_001}, "timeout_ms"),
    ({"timeout_ms": "5000"}, "timeout_ms"),
    ({"callback_url": "ftp://hooks.example.com/x"}, "http or https"),
    ({"callback_url": "https://user:pw@hooks.example.com/x"}, "credentials"),
    ({"callback_url": "http://10.1.2.3/x"}, "blocked"),
    ({"callback_url": "http://169.254.169.254/latest"}, "blocked"),
    ({"callback_url": "http://[::ffff:192.168.0.1]/x"}, "blocked"),
    ({"callback_url": "http://localhost:9/x"}, "blocked"),
    ({"callback_url": "http://hooks.example.com:99999/x"}, "callback_url"),
    ({"surprise": 1}, "unknown fields"),
]


@pytest.mark.parametrize(("change", "says"), BAD)
def test_a_bad_registration_is_400_invalid_registration(
    clients: dict[str, Any], change: dict[str, Any], says: str
) -> None:
    body = {**hook("https://hooks.example.com/cb", "x"), **change}
    resp = clients["alice"].post("/v1/hooks", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "invalid_registration" and says in resp.json()["error"]
    assert not HookRegistration.objects.exists()


def test_registration_defaults_scope_and_isolation(clients: dict[str, Any]) -> None:
    alice, charlie, bob = clients["alice"], clients["charlie"], clients["bob"]
    hook_id = register(alice, owner="sec", name="d", phase="post", callback_url="https://hooks.example.com/cb")
    (row,) = alice.get("/v1/hooks").json()["hooks"]
    assert row["id"] == hook_id and hook_id.startswith("hook_") and len(hook_id) == 21
    assert (row["agents"], row["tools"], row["fail_mode"], row["timeout_ms"]) == (["*"], ["*"], "open", 5000)
    assert row["tenant_id"] == "acme"
    gone = charlie.delete(f"/v1/hooks/{hook_id}")  # another tenant's hook: not found
    assert (gone.status_code, gone.json()["code"]) == (404, "not_found")
    assert bob.get("/v1/hooks").status_code == 403  # no tenant-member carve-in for /v1/hooks
    assert bob.post("/v1/hooks", json={}).status_code == 403
    same = register(charlie, owner="sec", name="d", phase="pre", callback_url="https://hooks.example.com/cb")
    assert same != hook_id and HookRegistration.objects.count() == 2  # (owner, name) is per tenant
    assert [h["id"] for h in clients["ops"].get("/v1/hooks").json()["hooks"]] == [hook_id, same]  # an admin: all
    assert alice.delete(f"/v1/hooks/{hook_id}").json() == {"deleted": hook_id}
    again = alice.delete(f"/v1/hooks/{hook_id}")
    assert (again.status_code, again.json()["code"]) == (404, "not_found")


def test_no_callback_is_made_inside_a_transaction() -> None:
    hook = Hook(
        hook_id="hook_0",
        tenant_id="",
        owner="o",
        name="n",
        phase=HookPhase.PRE,
        agents=("*",),
        tools=("*",),
        callback_url="http://127.0.0.1:9/",
        fail_mode=HookFailMode.OPEN,
        timeout_ms=100,
    )
    with transaction.atomic(), pytest.raises(RuntimeError, match="inside a database transaction"):
        callback.call(hook, {})
