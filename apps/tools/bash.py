"""The `Bash` tool (SPEC 6.9, 8): each command runs in a bubblewrap sandbox
(apps.tools.sandbox: read-only system, only the run's volumes, no network, no host
process visible, its own unprivileged uid, rlimits).

- Off unless LOOMCYCLE_BASH_ENABLED=1; needs an rw volume (cwd = its root). Without the
  sandbox (bwrap missing) every call is refused naming the package, unless the operator set
  LOOMCYCLE_BASH_UNSANDBOXED=1: then `/bin/sh` runs as the worker's own user, with only
  the limits below (posture B: trusted operators; `up` and `doctor` warn).
- Who may call it: apps.core.privileged (agents of the operator's yaml, listed tenants).
- `/bin/sh -c <command>` in a new session (its own process group); the
  environment is PATH plus the names LOOMCYCLE_BASH_ALLOWED_CREDS lists (the
  run's credential of that name, else the worker's variable).
- Timeout 30 s by default, 300 s at most; the run's cancel kills it too. Both
  kill the whole process group (SIGKILL); so does the end of the command,
  so a background child does not outlive the call.
  Killed means SIGKILL: no grace period for cleanup.
- Unsandboxed, a child that leaves the group (`setsid`) is not killed; once the shell has
  exited, its output is read for DRAIN_GRACE_S more, then the pipe is closed, so
  neither the timeout nor the cancel waits on it. Sandboxed, no child outlives the
  sandbox's PID namespace.
- stdout and stderr combined, kept up to 1 MiB (the rest is read and dropped).
- It holds no DB connection; the engine's tool batch gives its admission slot
  away after LOOMCYCLE_ENGINE_ADMISSION_TOOLS_AFTER_MS.
- The watchdog thread waits on the run's cancel event (no polling); after a
  command ends early it stays parked on that event until the timeout passes,
  then exits without touching anything.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from apps.core.tools import Tool, ToolContext, ToolResult, VolumeBinding
from apps.tools import sandbox
from apps.tools.volumes import VolumeUnavailable, pick, root_of

DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 300
OUTPUT_CAP = 1024 * 1024
DRAIN_GRACE_S = 0.5  # output read after the shell exited, for a child that left the group
FIELDS = frozenset({"command", "timeout_seconds", "volume", "description"})


@dataclass
class _Watch:
    """Shared by the reading thread and the watchdog; `lock` orders the kill against reaping."""

    proc: subprocess.Popen[bytes]
    lock: threading.Lock
    finished: bool = False
    killed_for: str = ""


def scrubbed_env(credentials: Mapping[str, str]) -> dict[str, str]:
    """PATH, plus each name LOOMCYCLE_BASH_ALLOWED_CREDS lists: the run's credential of
    that name (`user_credentials`, `user_bearer`) if it has one, else the worker's variable."""
    allowed = [n.strip() for n in settings.LOOMCYCLE.bash_allowed_creds.split(",") if n.strip()]
    env = {"PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"}
    for name in allowed:
        value = credentials.get(name, os.environ.get(name))
        if value is not None:
            env[name] = value
    return env


def _kill_group(watch: _Watch, why: str) -> None:
    with watch.lock:
        if watch.finished:  # reaped (or about to be): its group id may belong to someone else now
            return
        watch.killed_for = watch.killed_for or why
        try:
            os.killpg(watch.proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone already
            return


def _watchdog(watch: _Watch, cancelled: threading.Event, timeout_s: int) -> None:
    if cancelled.wait(timeout_s):
        _kill_group(watch, "run cancelled")
    else:
        _kill_group(watch, f"timed out after {timeout_s} s")


def _read_capped(watch: _Watch, wake_fd: int) -> tuple[bytes, int]:
    """The combined output up to OUTPUT_CAP, and how many bytes there were. Reads until
    EOF, or until DRAIN_GRACE_S after `wake_fd` turns readable (the shell exited and its
    group was killed): a child that left the group (setsid) may hold the pipe open forever."""
    assert watch.proc.stdout is not None
    fd = watch.proc.stdout.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(wake_fd, select.POLLIN)
    kept, total = bytearray(), 0
    stop_at: float | None = None
    while True:
        wait_ms = None if stop_at is None else max(0, int((stop_at - time.monotonic()) * 1000))
        if wait_ms == 0:
            return bytes(kept), total
        for ready, _ in poller.poll(wait_ms):
            if ready == wake_fd:
                poller.unregister(wake_fd)
                stop_at = time.monotonic() + DRAIN_GRACE_S
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return bytes(kept), total
            total += len(chunk)
            if len(kept) < OUTPUT_CAP:
                kept += chunk[: OUTPUT_CAP - len(kept)]


def _on_exit(watch: _Watch, wake_w: int) -> None:
    """Wait for the shell to exit WITHOUT reaping it (so its process group id stays
    ours), kill what is left of the group, then wake the reader."""
    os.waitid(os.P_PID, watch.proc.pid, os.WEXITED | os.WNOWAIT)
    try:
        os.killpg(watch.proc.pid, signal.SIGKILL)  # the leader is not reaped yet: its group id is still ours
    except ProcessLookupError:
        pass  # every member already exited
    os.write(wake_w, b"x")


def _finish(watch: _Watch, exited: threading.Thread) -> int:
    """After the output ended (or the drain grace passed): wait for the exit thread
    (it killed the group), then reap the shell."""
    exited.join()
    with watch.lock:
        watch.finished = True
    return watch.proc.wait()


def _result(out: bytes, total: int, code: int, watch: _Watch) -> ToolResult:
    text = out.decode("utf-8", errors="replace")
    if total > OUTPUT_CAP:
        text += f"\n[output truncated at {OUTPUT_CAP} bytes]"
    if watch.killed_for:
        return ToolResult(f"{text}\n[killed: {watch.killed_for}]".lstrip("\n"), is_error=True)
    if code != 0:
        status = f"exit: {code}" if code > 0 else f"killed: signal {-code}"
        return ToolResult(f"{text}\n[{status}]".lstrip("\n"), is_error=True)
    return ToolResult(text)


def _timeout(data: dict[str, Any]) -> int:
    value = data.get("timeout_seconds", DEFAULT_TIMEOUT_S)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_seconds must be an integer from 1 to {MAX_TIMEOUT_S}")
    return value


def run_command(spec: sandbox.Launch, timeout_s: int, cancelled: threading.Event) -> ToolResult:
    proc = subprocess.Popen(
        spec.argv,
        cwd=spec.cwd,
        env=spec.env,
        user=spec.uid,  # dropped in the child before exec (no preexec_fn: the worker has threads)
        group=spec.uid,
        extra_groups=[] if spec.uid is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: killed as a whole
        close_fds=True,
    )
    watch = _Watch(proc=proc, lock=threading.Lock())
    threading.Thread(target=_watchdog, args=(watch, cancelled, timeout_s), name="lc-bash-watch", daemon=True).start()
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
    exited = threading.Thread(target=_on_exit, args=(watch, wake_w), name="lc-bash-exit", daemon=True)
    exited.start()
    try:
        out, total = _read_capped(watch, wake_r)
        assert proc.stdout is not None
        proc.stdout.close()  # an escaped child still writing gets EPIPE, not our memory
        code = _finish(watch, exited)
    finally:
        exited.join()  # it writes to wake_w: close the pipe only after it is done
        os.close(wake_r)
        os.close(wake_w)
    return _result(out, total, code, watch)


def _refusal(ctx: ToolContext, data: dict[str, Any]) -> str | None:
    conf = settings.LOOMCYCLE
    if not conf.bash_enabled:
        return "Bash is not configured on this runtime (LOOMCYCLE_BASH_ENABLED is off)"
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        return f"unknown fields {unknown}"
    if not isinstance(data.get("command"), str) or not data["command"].strip():
        return "command must be a non-empty string"
    return None if conf.bash_unsandboxed else sandbox.unavailable()


def _launch(ctx: ToolContext, command: str, picked: VolumeBinding, cwd: str, env: dict[str, str]) -> sandbox.Launch:
    """The sandbox over the run's volumes (each that exists on this worker), `cwd` writable."""
    if settings.LOOMCYCLE.bash_unsandboxed:
        return sandbox.Launch(argv=["/bin/sh", "-c", command], env=env, cwd=cwd)
    writable: list[str] = [cwd]
    readable: list[str] = []
    for binding in ctx.volumes:
        if binding.name == picked.name:
            continue
        try:
            path = str(root_of(ctx, binding))
        except VolumeUnavailable:
            continue  # the call did not ask for it; the tools that do say why
        if binding.mode == "rw":
            _give_ephemeral(binding, path)
        (writable if binding.mode == "rw" else readable).append(path)
    _give_ephemeral(picked, cwd)
    return sandbox.launch(command, cwd=cwd, writable=writable, readable=readable, env=env)


def _give_ephemeral(binding: VolumeBinding, path: str) -> None:
    """A root worker's commands run as the sandbox uid: a run's ephemeral directory (the runtime's
    own scratch) becomes that uid's, so the command can write there as the agent expects."""
    uid = sandbox.host_uid()
    if binding.ephemeral and uid is not None and os.stat(path).st_uid != uid:
        os.chown(path, uid, uid)


def bash_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    refused = _refusal(ctx, data)
    if refused:
        return ToolResult(refused, is_error=True)
    try:
        timeout_s = _timeout(data)
        binding = pick(ctx, data.get("volume"))
        if binding.mode != "rw":
            return ToolResult(f"Bash needs an rw volume; {binding.name!r} is read-only for this run", is_error=True)
        cwd = str(root_of(ctx, binding))
        spec = _launch(ctx, data["command"], binding, cwd, scrubbed_env(ctx.credentials))
    except (ValueError, VolumeUnavailable) as exc:
        return ToolResult(str(exc), is_error=True)
    connection.close()  # no DB connection is held while the command runs
    return run_command(spec, timeout_s, ctx.cancelled)


BASH_TOOL = Tool(
    name="Bash",
    description="Run a shell command (/bin/sh -c) with the volume root as working directory. Combined "
    f"stdout+stderr up to {OUTPUT_CAP} bytes; timeout_seconds default {DEFAULT_TIMEOUT_S}, max {MAX_TIMEOUT_S}. "
    "Runs in a sandbox: only the bound volumes, no network.",
    input_schema={
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout_seconds": {"type": "integer", "default": DEFAULT_TIMEOUT_S, "maximum": MAX_TIMEOUT_S},
            "volume": {"type": "string"},
            "description": {"type": "string"},
        },
        "required": ["command"],
    },
    execute=bash_execute,
    operator_only=True,
)
