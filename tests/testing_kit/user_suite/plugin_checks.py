"""Run by tests/testing_kit/test_plugin.py in a user-like pytest process
(`-p loomcycle_testing`, its own ini, a Django project of its own), together
with examples/test_my_agent.py. Not collected by the project's suite."""

import json
import os
import time
from urllib.parse import quote

import httpx
import pytest
from kit_record import record_runtime

from loomcycle_testing import LoomcycleError, RunTimeout, RuntimeStartError, assert_tool_called, define_agent, run_agent
from loomcycle_testing.runtime import start_runtime

MEMORY_GET = {"op": "get", "scope": "user", "key": "colour"}


def test_assert_tool_called_lists_the_calls_that_were_made(define_agent, run_agent):
    define_agent(
        "reader",
        provider="mock",
        model="mock-tool-loop?tool=Memory&calls=1&input=" + quote(json.dumps(MEMORY_GET)),
        tools=["Memory"],
        memory_scopes=["user"],
    )
    result = run_agent("reader", "What is my colour?", user_id="bob")
    assert_tool_called(result, "Memory", op="get")
    with pytest.raises(AssertionError) as failure:
        assert_tool_called(result, "Memory", op="set")
    message = str(failure.value)
    assert f'no call of Memory with {{"op": "set"}} in run {result.run_id}' in message
    assert 'Memory {"key": "colour", "op": "get", "scope": "user"}' in message


def test_result_carries_events_tool_calls_and_transcript(run_agent):
    result = run_agent("greeter", "hello there")  # the static agent of user.yaml
    assert result.status == "completed" and result.stop_reason == "end_turn" and result.error == ""
    assert [e for e, _ in result.events][:3] == ["session", "agent", "started"]
    assert result.events[-1][0] == "done"
    assert result.text == "done"
    (call,) = result.tool_calls
    assert (call.name, call.input, call.is_error) == ("Context", {"op": "self"}, False)
    assert json.loads(call.result)["run_id"] == result.run_id
    roles = [m["role"] for m in result.transcript]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert result.transcript[1]["content"] == [{"type": "text", "text": "hello there"}]
    assert result.transcript[2]["content"][0]["type"] == "tool_use"
    assert result.transcript[3]["content"][0]["tool_use_id"] == call.id


def test_define_agent_forks_a_static_agent_for_a_tenant(loomcycle_runtime, loomcycle_client):
    mint = {"op": "create", "name": "acme-dev", "tenant_id": "acme", "scopes": ["substrate:tenant"]}
    token = loomcycle_client.post("/v1/_operatortokendef", json=mint).json()["token"]
    with httpx.Client(base_url=loomcycle_runtime.url, headers={"Authorization": f"Bearer {token}"}) as acme:
        row = define_agent(acme, "greeter", system_prompt="Greet warmly.")
        assert row["promoted"] is True and row["parent_def_id"] and row["tenant_id"] == "acme"
        assert row["definition"]["model"] == "mock-tool-loop?tool=Context&calls=1"  # merged onto the yaml entry
        result = run_agent(acme, "greeter", "hi")
    assert result.transcript[0]["content"] == [{"type": "text", "text": "Greet warmly."}]


def test_define_agent_refuses_a_static_name_in_the_shared_tenant(define_agent):
    with pytest.raises(LoomcycleError, match="'greeter' is a static yaml entry and this client is in the shared"):
        define_agent("greeter", system_prompt="never used")


def test_only_the_users_config_is_loaded(loomcycle_client):
    names = {row["name"] for row in loomcycle_client.get("/v1/_agentdef/names").json()["names"]}
    assert "greeter" in names and "echo" not in names  # no bundled loomcycle.yaml underneath


def test_a_refused_run_is_a_clear_error(run_agent):
    with pytest.raises(LoomcycleError, match=r"HTTP 400 unknown_agent"):
        run_agent("no-such-agent", "hi")


def test_a_failed_run_has_status_failed_and_its_error(define_agent, run_agent):
    define_agent("scripted", provider="mock", model="mock-script")
    result = run_agent("scripted", 'MOCK_SCRIPT: [{"tol": "Memory"}]')
    assert (result.status, result.stop_reason, result.events[-1][0]) == ("failed", "", "error")
    assert "unknown key 'tol'" in result.error


def test_a_run_past_its_timeout_is_cancelled(define_agent, run_agent, loomcycle_client):
    define_agent("scripted", provider="mock", model="mock-script")
    with pytest.raises(RunTimeout, match=r"of 'scripted' did not end within 1 s \(events: session, agent"):
        run_agent("scripted", 'MOCK_SCRIPT: [{"sleep_ms": 120000, "text": "late"}]', timeout=1, agent_id="sleepy")
    deadline = time.monotonic() + 30
    while loomcycle_client.get("/v1/agents/sleepy").json()["state"] != "cancelled":
        assert time.monotonic() < deadline, "run_agent's cancel did not land"
        time.sleep(0.1)


def test_the_users_own_django_settings_are_untouched():
    from django.conf import settings

    assert os.environ["DJANGO_SETTINGS_MODULE"] == "users_own_project.settings"
    assert settings.SECRET_KEY == "the-users-own-project"


def test_a_runtime_that_cannot_start_reports_its_log(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: [oops\n")
    with pytest.raises(RuntimeStartError, match=r"(?s)exited with 1 while starting.*invalid yaml"):
        start_runtime(tmp_path / "data", [bad], timeout=120)


def test_zz_record_the_runtimes_processes(loomcycle_runtime):
    """For the outer test, which checks after this session that none is left."""
    record_runtime(loomcycle_runtime)
