"""The `loomcycle` command line, driven as a subprocess against a running stack (issue 24):
pipes, exit codes, --json, --background, logs -f across a web restart, send, cancel, ps,
agent apply, the ad-hoc --model form, memory, channels, pause, and Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import queue
import secrets
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

import pytest
from django.db import connection

from apps.runs.models import Run, RunEvent, RunStatus
from apps.substrate.models import AgentDef
from tests.cli.conftest import Web, cli, cli_argv, cli_env, json_lines, script
from tests.conftest import wait_for, wait_status
from tests.procs import ROOT

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_a_pipe_feeds_one_runs_answer_to_the_next(web_proc: Web) -> None:
    relay = script({"echo": True}, before="relayed: ")  # what the first run answers: the second run's prompt
    first = script({"text": relay})
    loomcycle = " ".join(cli_argv())
    pipeline = f'set -o pipefail; printf %s "$FIRST" | {loomcycle} run scripted | {loomcycle} run scripted'
    done = subprocess.run(
        ["bash", "-c", pipeline],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env={**cli_env(web_proc), "FIRST": first},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)  # the second run's echo of the request its model received
    assert seen["messages"][0]["text"].strip() == relay
    assert "usage:" in done.stderr  # progress went to stderr, not into the pipe


def test_exit_codes_say_how_the_run_ended(web_proc: Web) -> None:
    ok = cli(web_proc, "run", "scripted", script({"text": "fine"}))
    assert (ok.returncode, ok.stdout) == (0, "fine\n")
    failed = cli(web_proc, "run", "scripted", 'MOCK_SCRIPT: [{"tol": "Context"}]')
    assert failed.returncode == 1
    assert "unknown key 'tol'" in failed.stderr
    refused = cli(web_proc, "run", "no-such-agent", "hi")
    assert refused.returncode == 4
    assert "unknown_agent" in refused.stderr
    unreachable = cli(web_proc, "--url", "http://127.0.0.1:9", "run", "scripted", "hi")
    assert unreachable.returncode == 5
    assert "cannot reach the runtime" in unreachable.stderr


def test_json_prints_every_event_and_background_prints_the_ids(web_proc: Web) -> None:
    streamed = cli(web_proc, "run", "--json", "scripted", script({"text": "as json"}))
    assert streamed.returncode == 0, streamed.stderr
    events = json_lines(streamed.stdout)
    types = [e["type"] for e in events]
    assert types[:3] == ["session", "agent", "started"] and types[-1] == "done"
    assert "".join(e["data"]["text"] for e in events if e["type"] == "text") == "as json"  # live pieces + the rest
    seqs = [e["seq"] for e in events if e["seq"] is not None]
    assert seqs == sorted(set(seqs))

    started = cli(web_proc, "run", "--background", "scripted", script({"text": "later"}))
    assert started.returncode == 0, started.stderr
    ref = json.loads(started.stdout)
    assert ref["run_id"].startswith("r_") and ref["agent_id"].startswith("a_")
    followed = cli(web_proc, "logs", ref["agent_id"], "-f", "--json")
    assert followed.returncode == 0, followed.stderr
    assert [e["data"]["text"] for e in json_lines(followed.stdout) if e["type"] == "text"] == ["later"]
    stored = cli(web_proc, "logs", ref["run_id"])
    assert "text" in stored.stdout and "later" in stored.stdout


def _lines(stream: IO[str] | None) -> tuple[queue.Queue[str], threading.Thread]:
    """A process's output lines, read by a thread (so waiting for one is bounded)."""
    found: queue.Queue[str] = queue.Queue()
    assert stream is not None

    def pump() -> None:
        for line in stream:
            found.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return found, reader


def drain(found: queue.Queue[str]) -> list[str]:
    items = []
    while not found.empty():
        items.append(found.get_nowait())
    return items


def test_logs_follow_reattaches_after_the_web_process_restarts(web_proc: Web) -> None:
    started = cli(web_proc, "run", "--background", "scripted", script({"sleep_ms": 3000, "text": "after the restart"}))
    run_id = json.loads(started.stdout)["run_id"]
    follow = subprocess.Popen(
        cli_argv("logs", run_id, "-f", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=cli_env(web_proc),
    )
    lines, reader = _lines(follow.stdout)
    first = json.loads(lines.get(timeout=30))  # the stream is open
    web_proc.stop()  # the connection drops while the run sleeps
    web_proc.start()
    assert follow.wait(timeout=60) == 0, follow.stderr.read() if follow.stderr else ""
    reader.join(timeout=10)
    events = [first, *(json.loads(line) for line in drain(lines))]
    seqs = [e["seq"] for e in events if e["seq"] is not None]
    stored = RunEvent.objects.filter(run_id=run_id).exclude(type="system_prompt").values_list("seq", flat=True)
    assert seqs == sorted(stored)  # every persisted event once, in order, across the reconnect
    assert events[-1]["type"] == "done"
    assert [e["data"]["text"] for e in events if e["type"] == "text"] == ["after the restart"]


def test_run_streams_on_across_a_web_restart(web_proc: Web) -> None:
    argv = cli_argv("run", "scripted", script({"sleep_ms": 3000, "text": "still here"}))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env(web_proc)
    )
    notes, reader = _lines(proc.stderr)
    assert notes.get(timeout=30).startswith("run r_")  # the POST's stream named the run
    web_proc.stop()  # the POST's connection drops while the run sleeps: the CLI re-attaches by GET
    web_proc.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    code = proc.wait(timeout=60)
    reader.join(timeout=10)
    assert code == 0, "".join(drain(notes))
    assert out == "still here\n"


def test_send_ps_and_cancel_drive_an_interactive_run(web_proc: Web) -> None:
    started = cli(web_proc, "run", "--background", "--interactive", "scripted", script({"text": "hi"}, {"echo": True}))
    ref = json.loads(started.stdout)
    wait_status(ref["run_id"], RunStatus.AWAITING_INPUT, timeout=30)
    live = json_lines(cli(web_proc, "ps", "--json", "--agent", "scripted").stdout)
    assert [(r["run_id"], r["state"]) for r in live] == [(ref["run_id"], "awaiting_input")]
    table = cli(web_proc, "ps").stdout
    assert ref["run_id"] in table and "awaiting_input" in table

    sent = cli(web_proc, "send", ref["run_id"], "the second turn")
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: RunEvent.objects.filter(run_id=ref["run_id"], type="awaiting_input").count() == 2, timeout=30)
    texts = [
        e["data"]["text"]
        for e in json_lines(cli(web_proc, "logs", ref["run_id"], "--json").stdout)
        if e["type"] == "text"
    ]
    assert json.loads(texts[-1])["messages"][-1]["text"] == "the second turn"

    parked = cli(web_proc, "cancel", "--turn", ref["run_id"])  # parked for input: no turn to stop
    assert parked.returncode == 4 and "not_mid_turn" in parked.stderr, parked.stderr
    cancelled = cli(web_proc, "cancel", ref["agent_id"])
    assert cancelled.stdout == f"cancelled {ref['run_id']}\n"
    wait_status(ref["run_id"], RunStatus.CANCELLED, timeout=10)
    assert cli(web_proc, "ps", "--json").stdout == ""
    assert [r["run_id"] for r in json_lines(cli(web_proc, "ps", "--json", "--all").stdout)] == [ref["run_id"]]
    again = cli(web_proc, "cancel", ref["run_id"])
    assert again.stdout == f"{ref['run_id']} had already ended (cancelled)\n"


def test_agent_apply_prints_the_content_hash_and_the_agent_runs(web_proc: Web, tmp_path: Path) -> None:
    spec = tmp_path / "filer.md"
    spec.write_text("---\nprovider: mock\nmodel: mock-script\ntools: []\n---\n" + script({"text": "from the file"}))
    applied = cli(web_proc, "agent", "apply", str(spec))
    assert applied.returncode == 0, applied.stderr
    row = AgentDef.objects.get(name="filer")
    assert applied.stdout == f"filer v1 {row.id} {row.content_sha256}\n"
    assert cli(web_proc, "agent", "apply", str(spec)).stdout.endswith("(unchanged)\n")
    shown = cli(web_proc, "agent", "show", "filer").stdout
    assert f"content_sha256: {row.content_sha256}" in shown
    assert "filer" in cli(web_proc, "agents").stdout
    assert cli(web_proc, "run", "filer", "go").stdout == "from the file\n"

    yaml_spec = tmp_path / "other.yaml"
    yaml_spec.write_text("name: filer\nprovider: mock\nmodel: mock-script\ntools: []\nsystem_prompt: v2\n")
    assert cli(web_proc, "agent", "apply", str(yaml_spec)).stdout.startswith("filer v2 ")


def test_the_ad_hoc_model_form_makes_a_versioned_agent(web_proc: Web, tmp_path: Path) -> None:
    system = script({"text": "ad hoc answer"})
    first = cli(web_proc, "run", "--model", "mock/mock-script", "--system", system, "hi")
    assert (first.returncode, first.stdout) == (0, "ad hoc answer\n"), first.stderr
    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text(system)
    again = cli(web_proc, "run", "--model", "mock/mock-script", "--system-file", str(prompt_file), "hi again")
    assert again.stdout == "ad hoc answer\n"
    (row,) = AgentDef.objects.filter(name__startswith="adhoc-")  # the same content: the same agent, one version
    assert (row.definition["provider"], row.definition["model"]) == ("mock", "mock-script")
    bad = cli(web_proc, "run", "--model", "no-slash", "hi")
    assert bad.returncode == 2 and "PROVIDER/MODEL" in bad.stderr


def test_memory_and_channel_round_trips(web_proc: Web) -> None:
    assert cli(web_proc, "memory", "set", "user", "u1", "colour", '{"c": "blue"}', "--embed").returncode == 0
    assert json.loads(cli(web_proc, "memory", "get", "user", "u1", "colour").stdout) == {"c": "blue"}
    missing = cli(web_proc, "memory", "get", "user", "u1", "nothing")
    assert missing.returncode == 4 and "not_found" in missing.stderr
    found = json.loads(cli(web_proc, "memory", "search", "blue colour", "--scope", "user", "--scope-id", "u1").stdout)
    assert [hit["key"] for hit in found["entries"]] == ["colour"]

    msg_id = cli(web_proc, "channel", "publish", "handoff", '{"job": 42}').stdout.strip()
    piped = cli(web_proc, "channel", "publish", "handoff", stdin="plain text").stdout.strip()
    tail = json_lines(cli(web_proc, "channel", "tail", "handoff").stdout)
    assert [(m["id"], m["value"]) for m in tail] == [(msg_id, {"job": 42}), (piped, "plain text")]


def test_pause_refuses_new_runs_until_resume(web_proc: Web) -> None:
    assert json.loads(cli(web_proc, "pause", "--timeout-ms", "1000").stdout)["state"] == "paused"
    try:
        refused = cli(web_proc, "run", "scripted", script({"text": "no"}))
        assert refused.returncode == 4 and "runtime_paused" in refused.stderr
    finally:
        resumed = cli(web_proc, "resume")
    assert json.loads(resumed.stdout)["state"] == "running"


def test_ctrl_c_cancels_the_run_within_a_second(web_proc: Web) -> None:
    agent_id = f"a_{secrets.token_hex(8)}"
    argv = cli_argv("run", "--agent-id", agent_id, "scripted", script({"sleep_ms": 120_000, "text": "too late"}))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env(web_proc)
    )
    run_id = wait_for(
        lambda: (
            RunEvent.objects.filter(run__agent_id=agent_id, type="started").values_list("run_id", flat=True).first()
        ),
        timeout=30,
    )
    with connection.cursor() as cur:  # measured on Postgres's clock, which stamps completed_at too
        cur.execute("SELECT now()")
        (asked,) = cur.fetchone()
    proc.send_signal(signal.SIGINT)
    done = wait_status(run_id, RunStatus.CANCELLED, timeout=10)
    took = (done.completed_at - asked).total_seconds()
    assert took < 1.0, f"cancel took {took:.2f} s"
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert "interrupted" in err and out == ""
    assert done.stop_reason == "interrupted (Ctrl-C)"


def test_a_closed_stdout_cancels_the_run_and_exits_141_quietly(web_proc: Web) -> None:
    agent_id = f"a_{secrets.token_hex(8)}"
    first = {"text": "first", "tool": "Context", "input": {"op": "self"}}
    more = {"text": "more", "tool": "Context", "input": {"op": "self"}, "sleep_ms": 200, "repeat": True}
    prompt = script(first, more)
    argv = cli_argv("run", "--agent-id", agent_id, "scripted", prompt)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env(web_proc)
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == "first\n"
    proc.stdout.close()  # `| head -1`
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in proc.stderr.read()
    run = wait_for(lambda: Run.objects.filter(agent_id=agent_id, status=RunStatus.CANCELLED).first(), timeout=20)
    assert run.stop_reason == "stdout closed"


def test_interactive_takes_each_line_as_a_turn_and_ends_at_end_of_input(web_proc: Web) -> None:
    steps = script({"text": "first answer"}, {"echo": True})
    talk = cli(web_proc, "run", "--interactive", "scripted", steps, stdin="the second turn\n")
    assert talk.returncode == 0, talk.stderr
    first, echoed = talk.stdout.splitlines()
    assert first == "first answer"
    assert json.loads(echoed)["messages"][-1]["text"] == "the second turn"


def test_the_spinner_shows_on_a_terminal_stderr_and_never_on_stdout(web_proc: Web) -> None:
    main, child = pty.openpty()
    argv = cli_argv("run", "scripted", script({"sleep_ms": 300, "text": "spun"}))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=child, text=True, cwd=ROOT, env=cli_env(web_proc, TERM="xterm")
    )
    os.close(child)
    shown = bytearray()
    while True:  # the terminal's output, until the process closes it (EIO)
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=30)
    os.close(main)
    assert (proc.returncode, out) == (0, "spun\n")
    assert b"scripted" in shown and b"step" in shown


def test_the_token_comes_from_loomcycle_token_and_scopes_what_ps_sees(
    web_proc: Web, people: dict[str, dict[str, str]]
) -> None:
    alice, charlie = (people[who]["authorization"].removeprefix("Bearer ") for who in ("alice", "charlie"))
    started = cli(web_proc, "run", "--background", "scripted", script({"text": "hi"}), LOOMCYCLE_TOKEN=alice)
    run_id = json.loads(started.stdout)["run_id"]
    assert [r["run_id"] for r in json_lines(cli(web_proc, "ps", "--all", "--json", LOOMCYCLE_TOKEN=alice).stdout)] == [
        run_id
    ]
    assert cli(web_proc, "--token", charlie, "ps", "--all", "--json").stdout == ""  # another tenant's run is unseen
    anonymous = cli(web_proc, "ps")
    assert anonymous.returncode == 4 and "unauthorized" in anonymous.stderr
