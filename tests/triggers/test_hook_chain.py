"""The pre/post chains in-process: registrations in the real Postgres, the
registry's Redis counter, callbacks to a loopback server, the real Context
tool as the call being intercepted. (Runs through workers: test_hooks.py.)"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from django.db import connection

from apps.core.errors import Invalid
from apps.core.tools import ToolContext, ToolResult
from apps.core.types import Principal
from apps.runs.engine.toolrun import _run_tool
from apps.runs.tools import CONTEXT_TOOL
from apps.triggers.hooks import cache, chain, services, widening
from apps.triggers.hooks.callback import HookCallFailed
from apps.triggers.hooks.types import Hook
from apps.triggers.models import HookFailMode, HookPhase, HookRegistration
from tests.triggers.hookserver import HookServer, hold, hook_server, reply

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
CTX = ToolContext(
    run_id="r_0000000000000001",
    agent_id="a_0000000000000001",
    session_id="s_0000000000000001",
    tenant_id="acme",
    user_id="u1",
    agent_name="scripted",
    agent_def_id="",
    agent_def_sha256="",
    provider="mock",
    model="mock-script",
    step=0,
    call_id="toolu_1",
    tools=("Context",),
)


@pytest.fixture
def server(transactional_db: None, settings: Any) -> Iterator[HookServer]:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("127.0.0.1",))
    cache.bump()
    with hook_server() as srv:
        yield srv
    HookRegistration.objects.all().delete()
    cache.bump()


def register(url: str, name: str, phase: str = "pre", principal: Principal = ACME, **extra: Any) -> None:
    body = {"owner": "sec", "name": name, "phase": phase, "callback_url": url, **extra}
    services.hook_register(principal=principal, spec=services.hook_spec(body))


def run_context(data: dict[str, Any]) -> ToolResult:
    return chain.intercept(CTX, "Context", data, partial(_run_tool, CONTEXT_TOOL))


def test_a_malformed_pre_reply_changes_nothing_and_fails_open(server: HookServer) -> None:
    register(server.on("/bad", reply({"input": {"op": "time"}, "allow_hosts": ["not a host"]})), "bad")
    result = run_context({"op": "self"})
    assert json.loads(result.text)["run_id"] == CTX.run_id  # the original input ran
    (error,) = result.events
    assert error["type"] == "hook_error" and "allow_hosts entry 'not a host'" in error["hook"]["error"]


def test_unknown_reply_fields_fail_closed(server: HookServer) -> None:
    register(server.on("/odd", reply({"inptu": {"op": "time"}})), "odd", fail_mode="closed")
    result = run_context({"op": "self"})
    assert result.is_error and "unknown fields ['inptu']" in result.text


def test_a_post_hook_failing_closed_turns_the_result_into_an_error(server: HookServer) -> None:
    register(server.on("/post", reply({"result": "not an object"})), "post", phase="post", fail_mode="closed")
    result = run_context({"op": "self"})
    assert result.is_error and "result must be an object" in result.text
    assert [e["type"] for e in result.events] == ["hook_error"]


def test_allow_hosts_of_an_owner_not_permitted_is_ignored(server: HookServer) -> None:
    register(server.on("/widen", reply({"allow_hosts": ["example.com"]})), "widen")
    result = run_context({"op": "self"})
    assert not result.is_error and result.events == ()  # not a failure, not a decision the run sees


def test_a_redirect_is_a_failed_call(server: HookServer) -> None:
    register(server.on("/moved", reply({}, 302)), "moved", fail_mode="closed")
    result = run_context({"op": "self"})
    assert result.is_error and "answered HTTP 302" in result.text


@pytest.mark.parametrize(
    ("value", "hosts"),
    [(["Example.COM.", ".api.example.com"], ("example.com", ".api.example.com")), ([], ())],
)
def test_allow_hosts_parse_normalises_hostnames(value: list[str], hosts: tuple[str, ...]) -> None:
    assert widening.parse(value) == hosts


@pytest.mark.parametrize("value", ["example.com", ["http://example.com"], ["a..b"], ["*"], [7], ["x" * 300]])
def test_allow_hosts_parse_refuses_what_is_not_a_hostname_list(value: Any) -> None:
    with pytest.raises(HookCallFailed):
        widening.parse(value)


def _hook(tenant: str, owner: str = "sec", **kw: Any) -> Hook:
    base: dict[str, Any] = {
        "hook_id": "hook_0",
        "tenant_id": tenant,
        "owner": owner,
        "name": "n",
        "phase": HookPhase.PRE,
        "agents": ("*",),
        "tools": ("*",),
        "callback_url": "https://hooks.example.com/",
        "fail_mode": HookFailMode.OPEN,
        "timeout_ms": 100,
    }
    return Hook(**{**base, **kw})


def test_the_permit_list_names_global_owners_bare_and_tenant_owners_qualified(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, hooks_permit_host_widen=("sec", "acme:net"))
    assert widening.permitted(_hook(""))
    assert not widening.permitted(_hook("acme"))  # a bare owner is the deployment's, not any tenant's
    assert widening.permitted(_hook("acme", owner="net"))
    assert not widening.permitted(_hook("beta", owner="net"))


def test_matching_by_tenant_agent_and_tool_glob() -> None:
    hook = _hook("acme", agents=("scripted",), tools=("Web*", "HTTP"))
    assert hook.applies(tenant_id="acme", agent="scripted", tool="WebFetch")
    assert hook.applies(tenant_id="acme", agent="scripted", tool="HTTP")
    assert not hook.applies(tenant_id="acme", agent="scripted", tool="HTTPS")
    assert not hook.applies(tenant_id="beta", agent="scripted", tool="HTTP")
    assert not hook.applies(tenant_id="acme", agent="other", tool="HTTP")
    assert _hook("").applies(tenant_id="beta", agent="x", tool="y")  # a global hook sees every tenant


def test_a_callback_goes_through_the_egress_guard(server: HookServer, settings: Any) -> None:
    register(server.on("/private", reply({"deny": {"text": "never read"}})), "private", fail_mode="closed")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=())
    result = run_context({"op": "self"})  # the same loopback URL, no longer allowed to be private
    assert result.is_error and "refused by the egress guard" in result.text and "loopback" in result.text
    assert server.calls() == []  # refused before any byte was sent


def test_a_callback_outside_the_operator_host_allowlist_is_refused(server: HookServer, settings: Any) -> None:
    """LOOMCYCLE_HTTP_HOST_ALLOWLIST bounds hook callbacks as it bounds the network tools:
    a host it does not list is refused before any byte, even one the private list admits."""
    url = server.on("/listed", reply({"deny": {"text": "the hook answered"}}))
    register(url, "listed", fail_mode="closed")  # registered while no allowlist is set
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=("allowed.test",))
    refused = run_context({"op": "self"})
    assert refused.is_error and "refused by the egress guard" in refused.text, refused.text
    assert "'127.0.0.1' is not in the allowed hosts (allowed.test)" in refused.text
    assert server.calls() == []  # refused before any byte was sent
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=("allowed.test", "127.0.0.1"))
    assert run_context({"op": "self"}).text == "the hook answered"  # listed: called


def test_registering_a_callback_outside_the_operator_host_allowlist_is_400(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=("allowed.test",))
    body = {"owner": "sec", "name": "far", "phase": "pre", "callback_url": "https://hooks.elsewhere.test/cb"}
    with pytest.raises(Invalid) as refused:
        services.hook_spec(body)
    assert refused.value.code == "invalid_registration"
    assert "'hooks.elsewhere.test' is not in LOOMCYCLE_HTTP_HOST_ALLOWLIST" in refused.value.message
    assert services.hook_spec({**body, "callback_url": "https://api.allowed.test/cb"}).callback_url.endswith("/cb")


def test_concurrent_re_registrations_of_one_name_both_answer(server: HookServer) -> None:
    """Two registrars of the same (owner, name) at once: each gets its row back
    (the loser used to re-read its own, already replaced, hook_id: a 500)."""
    url = server.on("/race", reply({}))
    errors: list[BaseException] = []
    ids: list[str] = []

    def register_once(barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            body = {"owner": "sec", "name": "race", "phase": "pre", "callback_url": url}
            ids.append(services.hook_register(principal=ACME, spec=services.hook_spec(body)).hook_id)
        except BaseException as exc:  # recorded and asserted on below
            errors.append(exc)
        finally:
            connection.close()

    for _ in range(25):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=register_once, args=(barrier,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert errors == []
    assert len(ids) == 50 and HookRegistration.objects.filter(name="race").count() == 1


def test_registrations_past_the_tenant_cap_are_400(server: HookServer, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, hooks_max_per_tenant=2)
    register(server.on("/a", reply({})), "a")
    register(server.on("/b", reply({})), "b")
    register(server.on("/a", reply({})), "a")  # replacing one is not a new registration
    with pytest.raises(Invalid) as refused:
        register(server.on("/c", reply({})), "c")
    assert refused.value.code == "invalid_registration" and "LOOMCYCLE_HOOKS_MAX_PER_TENANT" in refused.value.message
    other = Principal(tenant_id="globex", subject="bob", scopes=frozenset({"substrate:tenant"}))
    register(server.on("/c", reply({})), "c", principal=other)  # the cap is per tenant


def test_the_chain_budget_cuts_off_callbacks_and_skips_the_rest(server: HookServer, settings: Any) -> None:
    """Budget 300 ms, two held pre hooks of 5 s each failing open: the first is
    cut off at the budget, the second is not called at all."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, hooks_chain_budget_ms=300)
    register(server.on("/slow1", hold(server)), "slow1", timeout_ms=5000)
    register(server.on("/slow2", hold(server)), "slow2", timeout_ms=5000)
    started = time.monotonic()
    result = run_context({"op": "self"})
    assert time.monotonic() - started < 2.0
    assert json.loads(result.text)["run_id"] == CTX.run_id  # fail open: the tool ran
    errors = [e["hook"]["error"] for e in result.events if e["type"] == "hook_error"]
    assert len(errors) == 2 and "timed out" in errors[0] and "chain budget" in errors[1]
    assert len(server.calls("/slow2")) == 0
