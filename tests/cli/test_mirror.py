"""`loomcycle mirror DIR` as a subprocess against a running stack (issue 24): the files of a
run, a delete-and-rebuild, a live run followed by the long-running mirror, and inbox files
delivered exactly once, also when the mirror is SIGKILLed mid-delivery and restarted.

The kill is placed with a loopback proxy between the mirror and the web process: it
forwards the delivery request, holds the answer, and the test kills the mirror then, so the
runtime has the delivery and the mirror never learned of it (the worst window)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunEvent, RunInput, RunStatus
from apps.runs.prompt import Segment
from tests import procs
from tests.cli.conftest import Web, cli, cli_argv, cli_env, json_lines, script
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` and its content (but the lock and the mirror's temporary files)."""
    found = (p for p in sorted(root.rglob("*")) if not p.name.startswith(".") and p.is_file())
    return {str(p.relative_to(root)): p.read_text() for p in found}


def run_dir(root: Path, run_id: str, agent: str = "scripted") -> Path:
    return root / "agents" / agent / "runs" / run_id


def transcript(root: Path, run_id: str) -> list[dict[str, Any]]:
    path = run_dir(root, run_id) / "transcript.ndjson"
    return json_lines(path.read_text()) if path.exists() else []


def start_mirror(web: Web, url: str, root: Path, logdir: Path, name: str) -> subprocess.Popen[bytes]:
    """The long-running mirror, talking to `url` (the web process, or a proxy in front of it)."""
    env = cli_env(web, LOOMCYCLE_URL=url)
    return procs.spawn(cli_argv("mirror", str(root), "--interval", "0.2"), env, logdir / f"{name}.log")


def test_once_writes_a_runs_files_and_a_rebuild_reproduces_them(web_proc: Web, tmp_path: Path) -> None:
    started = cli(web_proc, "run", "--background", "scripted", script({"text": "mirrored"}))
    ref = json.loads(started.stdout)
    wait_status(ref["run_id"], RunStatus.COMPLETED, timeout=30)
    root = tmp_path / "m"
    unknown = root / "agents" / "no-such-agent" / "inbox"
    unknown.mkdir(parents=True)
    (unknown / "hello.txt").write_text("hi")

    done = cli(web_proc, "mirror", "--once", str(root))
    assert done.returncode == 0, done.stderr

    status = json.loads((run_dir(root, ref["run_id"]) / "status").read_text())
    assert (status["run_id"], status["state"]) == (ref["run_id"], "completed")
    events = json_lines((run_dir(root, ref["run_id"]) / "events.ndjson").read_text())
    stored = list(RunEvent.objects.filter(run_id=ref["run_id"]).order_by("seq").values_list("seq", "type"))
    assert [(e["seq"], e["type"]) for e in events] == stored
    assert [(t["role"], t["text"]) for t in transcript(root, ref["run_id"]) if t["role"] == "assistant"] == [
        ("assistant", "mirrored")
    ]
    (log,) = (root / "agents" / "scripted" / "logs").iterdir()
    assert [(e["run_id"], e["seq"]) for e in json_lines(log.read_text())] == [(ref["run_id"], s) for s, _ in stored]
    agent = json.loads((root / "agents" / "scripted" / "status").read_text())
    assert agent["latest_run"] == {"run_id": ref["run_id"], "state": "completed"} and agent["live_runs"] == []
    assert (unknown / ".failed" / "hello.txt").read_text() == "hi"
    assert "unknown_agent" in (unknown / ".failed" / "hello.txt.reason").read_text()

    first = tree(root)
    assert cli(web_proc, "mirror", "--once", str(root)).returncode == 0
    assert tree(root) == first  # a second pass adds nothing
    shutil.rmtree(root / "agents" / "scripted")
    assert cli(web_proc, "mirror", "--once", str(root)).returncode == 0
    assert tree(root) == first  # rebuilt from the runtime, line for line


def test_the_running_mirror_follows_a_live_run_and_delivers_an_inbox_file(
    web_proc: Web, tmp_path: Path, logdir: Path
) -> None:
    started = cli(web_proc, "run", "--background", "--interactive", "scripted", script({"text": "one"}, {"echo": True}))
    ref = json.loads(started.stdout)
    wait_status(ref["run_id"], RunStatus.AWAITING_INPUT, timeout=30)
    root = tmp_path / "m"
    mirror = start_mirror(web_proc, web_proc.url, root, logdir, "mirror-live")
    try:
        wait_for(lambda: ("assistant", "one") in [(t["role"], t.get("text")) for t in transcript(root, ref["run_id"])])
        inbox = root / "agents" / "scripted" / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)  # the mirror makes it too, after the run's files
        (inbox / ".turn.txt").write_text("from the inbox")
        (inbox / ".turn.txt").rename(inbox / "turn.txt")
        wait_for(lambda: (inbox / ".processed" / "turn.txt").exists(), timeout=30)
        replies = wait_for(
            lambda: [t["text"] for t in transcript(root, ref["run_id"]) if t["role"] == "assistant"][1:], timeout=30
        )
        assert json.loads(replies[0])["messages"][-1]["text"] == "from the inbox"
        users = [t for t in transcript(root, ref["run_id"]) if t["role"] == "user"]
        assert [(u["text"], u["source"]) for u in users][-1] == ("from the inbox", "api")

        parked = wait_status(ref["run_id"], RunStatus.AWAITING_INPUT, timeout=30)
        status = run_dir(root, ref["run_id"]) / "status"
        wait_for(lambda: json.loads(status.read_text())["last_seq"] == parked.last_seq, timeout=30)
        before = tree(run_dir(root, ref["run_id"]))
        shutil.rmtree(run_dir(root, ref["run_id"]))  # deleted under the running mirror
        wait_for(lambda: tree(run_dir(root, ref["run_id"])) == before, timeout=30)

        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(15) == 0
    finally:
        procs.stop(mirror)
        cli(web_proc, "cancel", ref["agent_id"])


class HoldingProxy:
    """A loopback HTTP proxy to the web process that holds the first request matching
    `hold` until `release`: forwarded first (`forward`: the runtime acted, the mirror never
    hears) or not at all (the delivery never left)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=30)
        self.hold: tuple[str, str] | None = None  # (method, path suffix)
        self.forward = True
        self.held, self.release = threading.Event(), threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                if proxy.hold and self.command == proxy.hold[0] and self.path.endswith(proxy.hold[1]):
                    proxy.hold = None
                    if proxy.forward:
                        proxy.upstream.request(self.command, self.path, content=body, headers=headers)
                    proxy.held.set()
                    proxy.release.wait(30)
                    return  # no answer reaches the (killed) mirror
                resp = proxy.upstream.request(self.command, self.path, content=body, headers=headers)
                self.send_response(resp.status_code)
                for key in ("content-type", "retry-after"):
                    if key in resp.headers:
                        self.send_header(key, resp.headers[key])
                self.send_header("content-length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()


@pytest.fixture
def proxy(web_proc: Web) -> Iterator[HoldingProxy]:
    p = HoldingProxy(web_proc.url)
    try:
        yield p
    finally:
        p.close()


def kill_mid_delivery(
    web: Web, proxy: HoldingProxy, root: Path, logdir: Path, hold: tuple[str, str], *, forward: bool = True
) -> None:
    """Start the mirror through `proxy`, hold its delivery (forwarded or not), SIGKILL it."""
    proxy.held.clear()
    proxy.hold, proxy.forward = hold, forward
    mirror = start_mirror(web, proxy.url, root, logdir, "mirror-killed")
    try:
        assert proxy.held.wait(30), "the mirror never sent the delivery"
    finally:
        os.killpg(mirror.pid, signal.SIGKILL)
        mirror.wait(10)
        proxy.release.set()
        proxy.release = threading.Event()


def test_an_inbox_file_is_delivered_once_when_the_mirror_is_killed_mid_delivery(
    web_proc: Web, proxy: HoldingProxy, tmp_path: Path, logdir: Path
) -> None:
    root = tmp_path / "m"
    inbox = root / "agents" / "scripted" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "a.txt").write_text(script({"text": "one"}, {"echo": True}, {"text": "three"}))

    kill_mid_delivery(web_proc, proxy, root, logdir, ("POST", "/v1/runs"))
    assert (inbox / ".processing" / "a.txt").exists()  # claimed, started, not settled
    assert Run.objects.filter(agent_name="scripted").count() == 1
    assert cli(web_proc, "mirror", "--once", str(root)).returncode == 0
    assert (inbox / ".processed" / "a.txt").exists() and not (inbox / ".processing" / "a.txt").exists()
    (run,) = Run.objects.filter(agent_name="scripted")
    assert run.interactive
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)

    (inbox / "b.txt").write_text("the second turn")
    kill_mid_delivery(web_proc, proxy, root, logdir, ("POST", f"/v1/runs/{run.id}/input"))
    assert (inbox / ".processing" / "b.txt").exists()
    wait_for(lambda: RunEvent.objects.filter(run_id=run.id, type="awaiting_input").count() == 2, timeout=30)
    assert cli(web_proc, "mirror", "--once", str(root)).returncode == 0
    assert sorted(p.name for p in (inbox / ".processed").iterdir()) == ["a.txt", "b.txt"]
    steered = [
        e.payload["segments"][0]["text"]
        for e in RunEvent.objects.filter(run_id=run.id, type="user_input").order_by("seq")
        if e.payload.get("source") == "api"
    ]
    assert steered == ["the second turn"]

    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    (inbox / "c.txt").write_text("the third turn")
    kill_mid_delivery(web_proc, proxy, root, logdir, ("POST", f"/v1/runs/{run.id}/input"), forward=False)
    assert (inbox / ".processing" / "c.txt").exists()  # claimed and planned; nothing reached the runtime
    assert cli(web_proc, "mirror", "--once", str(root)).returncode == 0
    wait_for(lambda: RunEvent.objects.filter(run_id=run.id, type="awaiting_input").count() == 3, timeout=30)
    assert sorted(p.name for p in (inbox / ".processed").iterdir()) == ["a.txt", "b.txt", "c.txt"]
    steered = [
        e.payload["segments"][0]["text"]
        for e in RunEvent.objects.filter(run_id=run.id, type="user_input").order_by("seq")
        if e.payload.get("source") == "api"
    ]
    assert steered == ["the second turn", "the third turn"]
    assert Run.objects.filter(agent_name="scripted").count() == 1
    cli(web_proc, "cancel", run.id)


def test_an_inbox_file_reaches_a_live_run_older_than_the_newest_thousand(web_proc: Web, tmp_path: Path) -> None:
    """A pass lists the tenant's newest 1000 runs; the agent's live run behind them still gets
    the file as a turn (asked for by agent name), and no second run is started."""
    started = cli(web_proc, "run", "--background", "--interactive", "scripted", script({"text": "one"}, {"echo": True}))
    ref = json.loads(started.stdout)
    old = wait_status(ref["run_id"], RunStatus.AWAITING_INPUT, timeout=30)
    who = Principal(tenant_id=old.tenant_id, subject="flood", scopes=frozenset({"substrate:admin"}))
    for _ in range(1000):  # newer runs of another agent push it out of the pass's listing
        services.run_create(principal=who, data=services.RunCreate(agent="echo", segments=[Segment(text="hi")]))
    root = tmp_path / "m"
    inbox = root / "agents" / "scripted" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "turn.txt").write_text("behind a thousand")
    done = cli(web_proc, "mirror", "--once", str(root))
    assert done.returncode == 0, done.stderr
    assert (inbox / ".processed" / "turn.txt").exists()
    assert RunInput.objects.filter(run_id=old.id, text="behind a thousand").exists()
    assert not Run.objects.filter(agent_name="scripted", created_at__gt=old.created_at).exists()
