"""Bash in-process (no database): the switch, the rw volume, the scrubbed
environment, exit codes, the output cap, and the timeout and cancel that kill
the whole process group. The cancel of a real run is in test_runs.py.

The tests that read a command's pids (`$$`, `$!`) and look them up on the host run Bash
unsandboxed (`bash_unsandboxed`): a sandboxed command has its own PID namespace, whose pids
mean nothing on the host. test_sandbox.py shows the same kills for sandboxed commands."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from apps.core.tools import VolumeBinding
from apps.tools.bash import OUTPUT_CAP, bash_execute
from tests.conftest import wait_for
from tests.factories.tools import ctx_for, err, gone, ok


@pytest.fixture
def bash_on(settings: pytest.FixtureRequest) -> None:
    settings.LOOMCYCLE = dataclasses.replace(  # type: ignore[attr-defined]
        settings.LOOMCYCLE,  # type: ignore[attr-defined]
        bash_enabled=True,
        bash_allowed_creds="LC_TEST_ALLOWED, LC_TEST_UNSET",
    )


@pytest.fixture
def bash_unsandboxed(settings: pytest.FixtureRequest) -> None:
    """Posture B (LOOMCYCLE_BASH_UNSANDBOXED=1): the command runs as the worker's own user."""
    settings.LOOMCYCLE = dataclasses.replace(  # type: ignore[attr-defined]
        settings.LOOMCYCLE,  # type: ignore[attr-defined]
        bash_enabled=True,
        bash_unsandboxed=True,
        bash_allowed_creds="LC_TEST_ALLOWED, LC_TEST_UNSET",
    )


def rw(root: Path) -> tuple[VolumeBinding, ...]:
    return (VolumeBinding(name="work", path=str(root), mode="rw"),)


def test_bash_is_refused_when_not_enabled(settings: pytest.FixtureRequest, tmp_path: Path) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_enabled=False)  # type: ignore[attr-defined]
    text = err(bash_execute(ctx_for(*rw(tmp_path)), {"command": "echo hi"}))
    assert "not configured" in text and "LOOMCYCLE_BASH_ENABLED" in text


@pytest.mark.usefixtures("bash_on")
def test_bash_needs_an_rw_volume(tmp_path: Path) -> None:
    assert "no volume bound" in err(bash_execute(ctx_for(), {"command": "echo hi"}))
    ro = VolumeBinding(name="work", path=str(tmp_path), mode="ro")
    assert "needs an rw volume" in err(bash_execute(ctx_for(ro), {"command": "touch x"}))
    assert not (tmp_path / "x").exists()


@pytest.mark.usefixtures("bash_on")
def test_bash_runs_in_the_volume_root_with_a_scrubbed_environment(
    sandbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LC_TEST_ALLOWED", "visible")
    monkeypatch.setenv("LC_TEST_SECRET", "hidden-value")
    out = ok(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": "pwd; env | sort; echo made > f.txt"}))
    lines = out.strip().split("\n")
    assert lines[0] == str(sandbox_dir)
    names = {line.split("=", 1)[0] for line in lines[1:]}
    assert names <= {"PATH", "LC_TEST_ALLOWED", "PWD", "SHLVL", "_"}  # what sh itself adds, nothing inherited
    assert "LC_TEST_ALLOWED=visible" in lines and "hidden-value" not in out
    assert (sandbox_dir / "f.txt").read_text() == "made\n"


@pytest.mark.usefixtures("bash_on")
def test_an_allowed_name_takes_the_runs_credential_first(sandbox_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_TEST_ALLOWED", "from-the-worker")
    creds = {"LC_TEST_ALLOWED": "from-the-run", "LC_TEST_UNSET": "run-only", "OTHER": "not-allowed"}
    ctx = dataclasses.replace(ctx_for(*rw(sandbox_dir)), credentials=creds)
    out = ok(bash_execute(ctx, {"command": "echo $LC_TEST_ALLOWED $LC_TEST_UNSET x${OTHER}x"}))
    assert out == "from-the-run run-only xx\n"


@pytest.mark.usefixtures("bash_on")
def test_a_non_zero_exit_is_an_error_with_the_output(sandbox_dir: Path) -> None:
    assert (
        err(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": "echo out; echo err >&2; exit 3"}))
        == "out\nerr\n\n[exit: 3]"
    )


@pytest.mark.usefixtures("bash_on")
def test_output_over_the_cap_is_truncated(sandbox_dir: Path) -> None:
    command = f"head -c {OUTPUT_CAP + 5000} /dev/zero | tr '\\0' x"
    text = ok(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": command}))
    assert text == "x" * OUTPUT_CAP + f"\n[output truncated at {OUTPUT_CAP} bytes]"


@pytest.mark.usefixtures("bash_on")
def test_bad_timeouts_are_refused(tmp_path: Path) -> None:
    for bad in (0, 301, "5", True):
        assert "timeout_seconds" in err(
            bash_execute(ctx_for(*rw(tmp_path)), {"command": "true", "timeout_seconds": bad})
        )


@pytest.mark.usefixtures("bash_unsandboxed")
def test_the_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    command = "sleep 60 & echo $! > bg.pid; sleep 60"
    started = time.monotonic()
    text = err(bash_execute(ctx_for(*rw(tmp_path)), {"command": command, "timeout_seconds": 1}))
    assert time.monotonic() - started < 5
    assert text.endswith("[killed: timed out after 1 s]")
    gone(int((tmp_path / "bg.pid").read_text()))


@pytest.mark.usefixtures("bash_unsandboxed")
def test_a_background_child_does_not_outlive_the_command(tmp_path: Path) -> None:
    ok(bash_execute(ctx_for(*rw(tmp_path)), {"command": "sleep 60 >/dev/null 2>&1 & echo $! > bg.pid"}))
    gone(int((tmp_path / "bg.pid").read_text()))


@pytest.mark.usefixtures("bash_unsandboxed")
def test_the_cancel_event_kills_the_command_within_a_second(tmp_path: Path) -> None:
    ctx = ctx_for(*rw(tmp_path))
    result: list[object] = []
    command = "echo $$ > sh.pid; exec sleep 60"
    worker = threading.Thread(target=lambda: result.append(bash_execute(ctx, {"command": command})))
    worker.start()
    wait_for(lambda: (tmp_path / "sh.pid").read_text().strip() if (tmp_path / "sh.pid").exists() else None, timeout=10)
    t0 = time.monotonic()
    ctx.cancelled.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - t0 < 1.0
    assert err(result[0]).endswith("[killed: run cancelled]")  # type: ignore[arg-type]
    gone(int((tmp_path / "sh.pid").read_text()))


# A child in its own session holding the output pipe; the shell goes on once it has left the group.
ESCAPE = "setsid sh -c 'echo $$ > esc.pid; exec sleep 30' & while [ ! -s esc.pid ]; do :; done"


@pytest.mark.usefixtures("bash_unsandboxed")
def test_the_timeout_returns_although_an_escaped_child_holds_the_output(tmp_path: Path) -> None:
    command = f"{ESCAPE}; echo hi; sleep 30"
    started = time.monotonic()
    text = err(bash_execute(ctx_for(*rw(tmp_path)), {"command": command, "timeout_seconds": 2}))
    assert time.monotonic() - started < 3.5
    assert text.startswith("hi") and text.endswith("[killed: timed out after 2 s]")
    os.kill(int((tmp_path / "esc.pid").read_text()), signal.SIGKILL)  # it left the group: ours to clean up


@pytest.mark.usefixtures("bash_unsandboxed")
def test_a_command_that_leaves_an_escaped_child_returns_after_a_short_grace(tmp_path: Path) -> None:
    command = f"{ESCAPE}; echo hi"
    started = time.monotonic()
    assert ok(bash_execute(ctx_for(*rw(tmp_path)), {"command": command, "timeout_seconds": 2})) == "hi\n"
    assert time.monotonic() - started < 1.5
    os.kill(int((tmp_path / "esc.pid").read_text()), signal.SIGKILL)


@pytest.mark.usefixtures("bash_unsandboxed")
def test_a_cancel_returns_although_an_escaped_child_holds_the_output(tmp_path: Path) -> None:
    ctx = ctx_for(*rw(tmp_path))
    result: list[object] = []
    command = "setsid sh -c 'echo $$ > esc.pid; exec sleep 30' & echo $$ > sh.pid; sleep 30"
    worker = threading.Thread(target=lambda: result.append(bash_execute(ctx, {"command": command})))
    worker.start()
    wait_for(lambda: (tmp_path / "sh.pid").exists() and (tmp_path / "esc.pid").exists(), timeout=10)
    t0 = time.monotonic()
    ctx.cancelled.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - t0 < 1.5
    assert err(result[0]).endswith("[killed: run cancelled]")  # type: ignore[arg-type]
    os.kill(int((tmp_path / "esc.pid").read_text()), signal.SIGKILL)


_PROBE = """
import ctypes, os, subprocess, sys
from loomcycle_project.hardening import not_dumpable
if os.geteuid() == 0:  # root reads any /proc/<pid>/environ: probe as an ordinary user, as the docs advise
    os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable, as a process started as this user is
if sys.argv[1] == "protected":
    assert not_dumpable()
child = subprocess.run(["/bin/sh", "-c", "cat /proc/$PPID/environ"], capture_output=True, env={"PATH": "/usr/bin:/bin"})
print("LEAKED" if b"LC_PROBE_SECRET=s3cret" in child.stdout else "HIDDEN")
"""


@pytest.mark.parametrize(("mode", "seen"), [("unprotected", "LEAKED"), ("protected", "HIDDEN")])
def test_a_non_dumpable_worker_hides_its_environment_from_a_same_uid_child(mode: str, seen: str) -> None:
    env = {**os.environ, "LC_PROBE_SECRET": "s3cret"}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == seen, out.stderr
