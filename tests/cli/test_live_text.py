"""Live text through `loomcycle run` and the Python client (issue 36): the answer's first piece
reaches stdout (or the caller) while the mock is still streaming the reply, asserted against the
mock's own send times, and the whole text is exact at the end, across a web restart too."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

import pytest

from apps.runs.models import Run, RunStatus
from loomcycle_http.client import Client, Event
from tests.cli.conftest import Web, cli_argv, cli_env
from tests.conftest import wait_for, wait_status
from tests.factories.live import REPLY, committed_text, script, sent_times
from tests.procs import ROOT

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _read_all(proc: subprocess.Popen[bytes]) -> list[tuple[float, bytes]]:
    """stdout's bytes with their arrival times (unix), until the process closes it."""
    assert proc.stdout is not None
    fd, out = proc.stdout.fileno(), []
    while True:
        select.select([fd], [], [], 60)
        data = os.read(fd, 65536)
        if not data:
            return out
        out.append((time.time(), data))


def test_loomcycle_run_writes_the_first_piece_before_the_call_ends(web_proc: Web) -> None:
    handle = "a_" + os.urandom(8).hex()
    argv = cli_argv("run", "--agent-id", handle, "scripted", script())
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=cli_env(web_proc))
    chunks = _read_all(proc)
    assert proc.wait(30) == 0
    run = Run.objects.get(agent_id=handle)
    assert chunks[0][0] < sent_times(run.id)[-1], "stdout saw nothing before the mock's last piece"
    assert b"".join(c for _, c in chunks).decode() == REPLY + "\n" == committed_text(run.id) + "\n"


def test_the_client_hands_text_live_and_exactly_across_a_web_restart(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        arrived: list[tuple[float, Event]] = []
        first = lc.runs.start("scripted", script())
        for event in first:
            arrived.append((time.time(), event))
        run_id = str(next(e.data["run_id"] for _, e in arrived if e.type == "agent"))
        first_text = next(at for at, e in arrived if e.type == "text")
        assert first_text < sent_times(run_id)[-1]
        assert "".join(e.text for _, e in arrived if e.type == "text") == committed_text(run_id) == REPLY

        ref = lc.runs.create("scripted", script(chunk_chars=4, chunk_ms=90))
        texts: list[Event] = []

        def follow() -> None:
            texts.extend(e for e in lc.runs.stream(ref.run_id) if e.type in ("text", "retry"))

        reader = threading.Thread(target=follow)
        reader.start()
        wait_for(lambda: sum(len(e.text) for e in texts) >= 20, timeout=30)  # live text is on the caller's side
        web_proc.stop()  # the connection drops in the middle of the call; the client re-attaches
        web_proc.start()
        reader.join(90)
        wait_status(ref.run_id, RunStatus.COMPLETED)
        assert [e.type for e in texts if e.type == "retry"] == []  # what came back again was skipped, not voided
        assert "".join(e.text for e in texts) == committed_text(ref.run_id) == REPLY
