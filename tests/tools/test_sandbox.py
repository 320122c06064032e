"""The Bash sandbox in-process (real bubblewrap, no database): posture A refuses Bash without
bwrap and names the package; posture B runs it unsandboxed when the operator says so; a
sandboxed command sees the system read-only, only its run's volumes, nothing of the runtime's
own places; and no process it starts outlives the command (the end, the timeout, the cancel),
including one that left its process group. Real runs and escapes: test_sandbox_runs.py."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from apps.core.tools import VolumeBinding
from apps.tools import sandbox
from apps.tools.bash import bash_execute
from tests.conftest import for_sandbox, wait_for
from tests.factories.tools import ctx_for, err, ok

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap (.ci/run installs it)")


def configure(settings: Any, **changes: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_enabled=True, **changes)


@pytest.fixture
def sandboxed(settings: Any) -> None:
    configure(settings, bash_unsandboxed=False)


def rw(*roots: Path) -> tuple[VolumeBinding, ...]:
    return tuple(VolumeBinding(name=f"v{i}", path=str(r), mode="rw", default=i == 0) for i, r in enumerate(roots))


def with_marker(marker: str) -> list[int]:
    """Host pids whose command line carries `marker` (a command's processes, seen from outside)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # exited meanwhile
            continue
    return found


def test_posture_a_refuses_bash_without_bubblewrap_naming_the_package(settings: Any, sandbox_dir: Path) -> None:
    configure(settings, bash_unsandboxed=False, bash_bwrap="/nonexistent/bwrap")
    text = err(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": "touch ran"}))
    assert "`bubblewrap`" in text and "/nonexistent/bwrap" in text and "LOOMCYCLE_BASH_UNSANDBOXED" in text
    assert not (sandbox_dir / "ran").exists()
    assert sandbox.probe() == sandbox.unavailable() == text


def test_posture_b_runs_unsandboxed_only_when_the_operator_says_so(settings: Any, sandbox_dir: Path) -> None:
    configure(settings, bash_unsandboxed=True, bash_bwrap="/nonexistent/bwrap")
    assert ok(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": "ls /proc | grep -c '^[0-9]'"})).strip() != "2"


@pytest.mark.usefixtures("sandboxed")
def test_the_sandbox_sees_the_system_read_only_and_only_its_volumes(settings: Any, sandbox_dir: Path) -> None:
    other = for_sandbox(sandbox_dir / "other")
    (sandbox_dir / "ro").mkdir()
    (sandbox_dir / "ro" / "f").write_text("read me")
    bindings = (*rw(sandbox_dir / "other"), VolumeBinding(name="ro", path=str(sandbox_dir / "ro"), mode="ro"))
    script = (
        "ls /; echo --; touch /usr/x /etc/x /x 2>/dev/null || echo sys-ro; cat ../ro/f; echo;"
        "touch ../ro/g || echo vol-ro;"
        "echo w > w; ls /proc | grep -c '^[0-9]'; id -u; ls /etc | tr '\\n' ' '"
    )
    out = ok(bash_execute(ctx_for(*bindings), {"command": script}))
    lines = out.split("\n")
    volume_top = Path(sandbox_dir).parts[1]  # a volume is bound at its own path, so its top folder shows
    system = {top for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin", "usr") if os.path.exists(f"/{top}")}
    assert set(lines[: lines.index("--")]) == system | {"dev", "etc", "proc", "tmp", volume_top}  # no /root, /home
    assert "sys-ro" in lines and "read me" in lines and "vol-ro" in lines
    assert (other / "w").read_text() == "w\n" and not (sandbox_dir / "ro" / "g").exists()
    assert int(lines[lines.index("vol-ro") + 1]) <= 4  # its own PID namespace: bwrap's init, sh, ls, grep
    assert lines[lines.index("vol-ro") + 2] == str(settings.LOOMCYCLE.bash_sandbox_uid)
    assert "passwd" in lines[-1] and "shadow" not in lines[-1] and "hostname" not in lines[-1]


@pytest.mark.usefixtures("sandboxed")
def test_the_runtimes_places_are_hidden_even_under_a_bound_volume(settings: Any, sandbox_dir: Path) -> None:
    """A volume that contains the data directory (secrets.json, the embedded Postgres) shows it empty."""
    data = for_sandbox(sandbox_dir / "data")
    (data / "secrets.json").write_text('{"secret_key": "s3cret"}')
    configure(settings, bash_unsandboxed=False, data_dir=str(data))
    out = err(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": "ls -A data | wc -l; cat data/secrets.json"}))
    assert out.startswith("0\n") and "No such file" in out and "s3cret" not in out


@pytest.mark.usefixtures("sandboxed")
def test_no_process_outlives_a_sandboxed_command_even_outside_its_group(sandbox_dir: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    command = f"sleep {marker} & setsid sleep {marker}1 & echo started"
    assert ok(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": command})) == "started\n"
    wait_for(lambda: not with_marker(marker), timeout=5)


@pytest.mark.usefixtures("sandboxed")
def test_the_timeout_kills_every_process_of_a_sandboxed_command(sandbox_dir: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    command = f"sleep {marker} & setsid sleep {marker}1 & sleep {marker}2"
    started = time.monotonic()
    text = err(bash_execute(ctx_for(*rw(sandbox_dir)), {"command": command, "timeout_seconds": 1}))
    assert time.monotonic() - started < 3 and text.endswith("[killed: timed out after 1 s]")
    wait_for(lambda: not with_marker(marker), timeout=5)


@pytest.mark.usefixtures("sandboxed")
def test_the_cancel_kills_every_process_of_a_sandboxed_command(sandbox_dir: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    ctx = ctx_for(*rw(sandbox_dir))
    result: list[Any] = []
    command = f"setsid sleep {marker} & touch started; sleep {marker}1"
    worker = threading.Thread(target=lambda: result.append(bash_execute(ctx, {"command": command})))
    worker.start()
    wait_for(lambda: (sandbox_dir / "started").exists() and len(with_marker(marker)) >= 2, timeout=10)
    t0 = time.monotonic()
    ctx.cancelled.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - t0 < 1.5
    assert err(result[0]).endswith("[killed: run cancelled]")
    wait_for(lambda: not with_marker(marker), timeout=5)
