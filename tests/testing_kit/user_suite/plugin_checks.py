"""Run by tests/testing_kit/test_plugin.py in a user-like pytest process
(`-p loomcycle_http.testing`, its own ini, a Django project of its own), together
with examples/test_my_agent.py. Not collected by the project's suite."""

import json
import os
import re
import signal
import time
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from kit_record import record_runtime

from loomcycle_http.client import Client
from loomcycle_http.testing import (
    LoomcycleError,
    RunTimeout,
    RuntimeStartError,
    assert_tool_called,
    define_agent,
    run_agent,
)
from loomcycle_http.testing.processes import SESSION_MARKER, marked_processes
from loomcycle_http.testing.runtime import start_runtime

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
    mint = {"name": "acme-dev", "tenant_id": "acme", "scopes": ["substrate:tenant"]}
    token = loomcycle_client.tokens.op("create", **mint)["token"]
    with Client(loomcycle_runtime.url, token=token) as acme:
        row = define_agent(acme, "greeter", system_prompt="Greet warmly.")
        assert row["promoted"] is True and row["parent_def_id"] and row["tenant_id"] == "acme"
        assert row["definition"]["model"] == "mock-tool-loop?tool=Context&calls=1"  # merged onto the yaml entry
        result = run_agent(acme, "greeter", "hi")
    assert result.transcript[0]["content"] == [{"type": "text", "text": "Greet warmly."}]


def test_define_agent_refuses_a_static_name_in_the_shared_tenant(define_agent):
    with pytest.raises(LoomcycleError, match="'greeter' is a static yaml entry and this caller is in the shared"):
        define_agent("greeter", system_prompt="never used")


def test_only_the_users_config_is_loaded(loomcycle_client):
    names = {row["name"] for row in loomcycle_client.agents.names()}
    assert "greeter" in names and "echo" not in names  # no bundled loomcycle.yaml underneath


def test_a_refused_run_is_a_clear_error(run_agent):
    with pytest.raises(LoomcycleError, match=r"HTTP 400 unknown_agent"):
        run_agent("no-such-agent", "hi")


def test_a_failed_run_has_status_failed_its_stop_reason_and_its_error(define_agent, run_agent):
    define_agent("scripted", provider="mock", model="mock-script")
    result = run_agent("scripted", 'MOCK_SCRIPT: [{"tol": 1}]')
    assert (result.status, result.stop_reason, result.events[-1][0]) == ("failed", "invalid_mock_script", "error")
    assert "unknown key 'tol'" in result.error


def _wait_cancelled(client, agent_id):
    deadline = time.monotonic() + 30
    while client.runs.get_by_agent_id(agent_id)["state"] != "cancelled":
        assert time.monotonic() < deadline, f"the cancel of {agent_id} did not land"
        time.sleep(0.1)


def test_a_run_past_its_timeout_is_cancelled(define_agent, run_agent, loomcycle_client):
    define_agent("scripted", provider="mock", model="mock-script")
    with pytest.raises(RunTimeout, match=r"of 'scripted' did not end or reach awaiting_input within 3 s") as late:
        run_agent("scripted", 'MOCK_SCRIPT: [{"sleep_ms": 60000, "text": "late"}]', timeout=3, agent_id="sleepy")
    assert str(late.value).endswith("agent_id sleepy: cancelled")
    _wait_cancelled(loomcycle_client, "sleepy")


def test_a_run_without_an_agent_id_gets_one_and_is_cancelled_by_it(define_agent, run_agent, loomcycle_client):
    """The client names the run, so a timeout can cancel it whatever the stream did."""
    define_agent("scripted", provider="mock", model="mock-script")
    with pytest.raises(RunTimeout) as late:
        run_agent("scripted", 'MOCK_SCRIPT: [{"sleep_ms": 60000}]', timeout=3)
    named = re.search(r"agent_id (a_[0-9a-f]{16}): cancelled$", str(late.value))
    assert named, str(late.value)
    _wait_cancelled(loomcycle_client, named.group(1))


def test_an_interactive_run_answers_turn_by_turn(define_agent, run_agent, send_input, loomcycle_client):
    define_agent("chatty", provider="mock", model="mock-script")
    first = run_agent("chatty", 'MOCK_SCRIPT: [{"text": "first"}, {"text": "second"}]', interactive=True)
    assert (first.status, first.text, first.events[-1][0]) == ("awaiting_input", "first", "awaiting_input")
    second = send_input(first, "go on")
    assert (second.status, second.text, second.events[-1][0]) == ("awaiting_input", "second", "awaiting_input")
    events = [e for e, _ in second.events]
    assert events[0] == "steer" and "agent" not in events and "first" not in json.dumps(second.events)
    assert [m["role"] for m in second.transcript] == ["user", "assistant", "user", "assistant"]
    third = send_input(second.run_id, "and then?")  # by run id: from the run's last event now
    assert (third.status, third.text) == ("awaiting_input", "ok")  # past the script's last step
    loomcycle_client.runs.cancel(third.agent_id, reason="enough")
    _wait_cancelled(loomcycle_client, third.agent_id)
    with pytest.raises(LoomcycleError, match=r"HTTP 404 not_in_flight"):
        send_input(third, "too late")


def _environ(pid):
    return dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)


def test_the_runtime_sees_none_of_the_users_celery_django_or_provider_settings(loomcycle_runtime):
    """The outer test set CELERY_BROKER_URL, DJANGO_SECRET_KEY, ANTHROPIC_API_KEY and
    OPENAI_BASE_URL (all `...must-not-leak`) here, and VOYAGE_BASE_URL, which
    the ini's loomcycle_pass_env passes on. Checked in every process that keeps
    its environment (Redis and Postgres's backends overwrite theirs with their
    title): up, web, worker, beat and the Postgres postmaster."""
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-test-must-not-leak"  # so the check below is not vacuous
    pids = set(loomcycle_runtime.processes()) | set(marked_processes(loomcycle_runtime.marker))
    environs = {pid: _environ(pid) for pid in pids}
    kept = {pid: env for pid, env in environs.items() if env.get(SESSION_MARKER) == loomcycle_runtime.marker}
    assert len(kept) >= 5, environs.keys()  # up, daphne, worker, beat, postmaster
    for pid, environ in kept.items():
        leaked = {k: v for k, v in environ.items() if "must-not-leak" in v or k.startswith("CELERY_")}
        assert leaked == {}, (pid, leaked)
        assert environ.get("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings") == "loomcycle_project.settings"
        assert environ["VOYAGE_BASE_URL"] == "http://127.0.0.1:1/passed-on"
    assert not any(b"must-not-leak" in Path(f"/proc/{pid}/environ").read_bytes() for pid in pids)


def test_the_runtime_runs_under_loomcycle_python(loomcycle_runtime):
    """up, and the Python processes it starts with its sys.executable (web, worker, beat)."""
    want = os.environ["KIT_RUNTIME_PYTHON"]
    assert loomcycle_runtime.python == want
    argv0 = [psutil.Process(pid).cmdline()[0] for pid in loomcycle_runtime.processes()]
    pythons = [a for a in argv0 if "redis" not in a]
    assert len(pythons) >= 4 and set(pythons) == {want}, argv0


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stop_ends_what_an_up_that_died_left_running(tmp_path):
    runtime = start_runtime(tmp_path / "data", [], timeout=240)
    ours = set(runtime.processes()) | {
        p.pid for p in psutil.process_iter(["cmdline"]) if str(runtime.data_dir) in " ".join(p.info["cmdline"] or [])
    }
    os.kill(runtime.pid, signal.SIGKILL)
    runtime.proc.wait(10)
    orphans = {pid: " ".join(psutil.Process(pid).cmdline()) for pid in ours if _alive(pid)}
    assert any("valkey-server" in c or "redis-server" in c for c in orphans.values()), orphans
    assert any(c.split(" ")[0].endswith("postgres") for c in orphans.values()), orphans
    with pytest.raises(RuntimeError, match=r"exit status -9\) left processes running; ended them") as ended:
        runtime.stop()
    assert {pid: line for pid, line in orphans.items() if _alive(pid)} == {}, str(ended.value)
    runtime.stop()  # nothing left: nothing to do, nothing raised


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
