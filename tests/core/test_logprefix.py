"""`manage.py up` prefixes each child's lines with its name, in colour on a terminal only
(loomcycle_project.logprefix)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from loomcycle_project.logprefix import RESET, Prefixer


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_each_line_of_each_child_is_prefixed_and_plain_off_a_terminal() -> None:
    out = io.StringIO()  # not a terminal: no colour
    logs = Prefixer(out, width=7)
    web = _child("import sys; print('listening'); print('oops', file=sys.stderr)")
    worker = _child("print('ready\\nworking')")
    threads = [logs.attach("web", web.stdout), logs.attach("worker0", worker.stdout)]  # type: ignore[arg-type]
    for proc, thread in zip((web, worker), threads, strict=True):
        proc.wait(30)
        thread.join(30)
    lines = out.getvalue().splitlines()
    assert sorted(lines) == sorted(["web     | listening", "web     | oops", "worker0 | ready", "worker0 | working"])
    assert "\033[" not in out.getvalue()


def test_the_prefix_is_coloured_on_a_terminal_unless_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            coloured = Prefixer(tty).prefix("beat")
            assert coloured.startswith("\033[") and coloured.endswith(RESET) and "beat" in coloured
            monkeypatch.setenv("NO_COLOR", "1")
            assert Prefixer(tty).prefix("beat") == "beat     |"
    finally:
        os.close(leader)
        os.close(follower)
