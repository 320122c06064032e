"""The Bash sandbox: bubblewrap (`bwrap`, Debian package `bubblewrap`) around every command.

What a command sees (docs/tools.md "Shell (Bash)"):
- the system read-only: /usr, the /bin, /sbin and /lib* links or directories as the host has
  them, and a few files of /etc (the loader's cache, alternatives, passwd/group, time zone);
  nothing else of the host. The checkout, the data directory (secrets.json, the embedded
  Postgres), and the Postgres and Redis socket directories are not bound; should one sit
  under a bound directory, an empty tmpfs hides it;
- the run's bound volumes at their host paths, rw ones writable, ro ones read-only; the
  working directory is the one the call picked;
- its own /proc, /dev (null, zero, random, tty...), an empty /tmp (a tmpfs of at most the
  file-size limit), and its own PID, IPC, UTS, cgroup and network namespaces: no host process
  is visible, and there is no network at all (loopback only; the HTTP tool is the way out);
- its own user namespace as uid/gid LOOMCYCLE_BASH_SANDBOX_UID with no capabilities and no
  further user namespaces. A worker running as root also drops the command to that uid on the
  host (so it owns nothing of root's, and the process limit holds: the kernel does not count
  root's processes); a non-root worker's command runs as the worker's uid on the host;
- the environment `bash.scrubbed_env` gives, as bwrap's own environment (which it passes on):
  never in argv, which any host process can read in /proc/<pid>/cmdline;
- rlimits set by util-linux `prlimit` before bwrap starts, inherited by every process.

`--die-with-parent` ends the command when the worker dies; when the command's first process
exits or is killed, the namespace's init exits and the kernel kills every process left in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

PACKAGE = "bubblewrap"
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group")


@dataclass(frozen=True)
class Launch:
    """How to start one command: its argv, its environment, the working directory of the first
    process, and the host uid and gid the launcher drops to first (None: the worker's own)."""

    argv: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: str = "/"
    uid: int | None = None


def unavailable() -> str | None:
    """Why no command can be sandboxed on this host (naming what to install), else None."""
    bwrap = settings.LOOMCYCLE.bash_bwrap
    if not (os.path.isfile(bwrap) and os.access(bwrap, os.X_OK)):
        return (
            f"Bash runs each command in a sandbox, and {bwrap} (the Debian package `{PACKAGE}`) is missing: "
            f"install it (apt-get install {PACKAGE}), or set LOOMCYCLE_BASH_UNSANDBOXED=1 to run commands "
            "unsandboxed (trusted operators only)"
        )
    if shutil.which("prlimit") is None:
        return "Bash's sandbox sets its limits with `prlimit` (Debian package `util-linux`), which is missing"
    return None


def host_uid() -> int | None:
    """The uid a command runs as on the host when the worker is root; None: the worker's own."""
    return settings.LOOMCYCLE.bash_sandbox_uid if os.geteuid() == 0 else None


def launch(command: str, *, cwd: str, writable: list[str], readable: list[str], env: dict[str, str]) -> Launch:
    """The sandboxed `/bin/sh -c command` in `cwd` (one of `writable`)."""
    uid = host_uid()
    argv = [*_limits(uid), settings.LOOMCYCLE.bash_bwrap, *_namespaces(), *_system()]
    for path in writable:
        argv += ["--bind", path, path]
    for path in readable:
        argv += ["--ro-bind", path, path]
    for hidden in _masked([*_SYSTEM, *writable, *readable]):
        argv += ["--tmpfs", hidden]
    argv += ["--chdir", cwd, "/bin/sh", "-c", command]
    return Launch(argv=argv, env=env, uid=uid)


def _namespaces() -> list[str]:
    sandbox = str(settings.LOOMCYCLE.bash_sandbox_uid)
    return [
        "--unshare-all",  # user (below: required), pid, net, ipc, uts, cgroup
        "--unshare-user",
        "--disable-userns",
        "--uid",
        sandbox,
        "--gid",
        sandbox,
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into a terminal the worker may have
        "--hostname",
        "sandbox",
    ]


def _system() -> list[str]:
    conf = settings.LOOMCYCLE
    out = []
    for top in _SYSTEM:
        if os.path.islink(top):
            out += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
    for name in _ETC:
        if os.path.exists(f"/etc/{name}"):
            out += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    private_tmp = "/tmp"  # noqa: S108 (a fresh tmpfs inside the sandbox, not the host's /tmp)
    size = str(conf.bash_limit_file_bytes)
    # /dev is a tmpfs bwrap fills with device nodes: read-only once made, with a sized /dev/shm,
    # so neither it nor /tmp holds more memory than one file may (RLIMIT_AS does not count tmpfs).
    shm = "/dev/shm"  # noqa: S108 (the sandbox's own, sized below)
    out += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", shm, "--remount-ro", "/dev"]
    out += ["--size", size, "--tmpfs", private_tmp]
    return out


def _limits(uid: int | None) -> list[str]:
    """`prlimit` with the command's limits; the process limit counts every process and thread
    of the host uid (the kernel's rule), so it is what that uid runs now plus the setting."""
    conf = settings.LOOMCYCLE
    processes = _tasks_of(os.getuid() if uid is None else uid) + conf.bash_limit_processes
    return [
        shutil.which("prlimit") or "prlimit",
        f"--cpu={conf.bash_limit_cpu_seconds}",
        f"--as={conf.bash_limit_memory_bytes}",
        f"--nproc={processes}",
        f"--fsize={conf.bash_limit_file_bytes}",
        f"--nofile={conf.bash_limit_open_files}",
        "--",
    ]


def _tasks_of(uid: int) -> int:
    """Processes and threads of `uid` on this host now (from /proc)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # exited meanwhile
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def _private_paths() -> Iterator[str]:
    """The runtime's own places a command must never see."""
    yield str(settings.BASE_DIR)
    yield settings.LOOMCYCLE.data_dir
    database: dict[str, Any] = settings.DATABASES["default"]
    options: dict[str, Any] = database.get("OPTIONS") or {}
    for host in (database.get("HOST"), options.get("host")):
        if isinstance(host, str) and host.startswith("/"):  # a unix socket directory
            yield host
    redis = settings.REDIS_URL
    for scheme in ("redis+socket://", "unix://"):
        if redis.startswith(scheme):
            yield os.path.dirname(redis[len(scheme) :].split("?", 1)[0])


def _masked(bound: list[str]) -> list[str]:
    """The private paths that lie under a bound directory (each is hidden under an empty tmpfs)."""
    out = []
    for private in filter(None, _private_paths()):
        real = os.path.realpath(private)
        if os.path.isdir(real) and any(_under(real, os.path.realpath(b)) for b in bound):
            out.append(real)
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def probe() -> str | None:
    """Run `true` in the sandbox once: None when it works, else why not (for doctor and up)."""
    missing = unavailable()
    if missing:
        return missing
    spec = launch("true", cwd="/", writable=[], readable=[], env={"PATH": "/usr/bin:/bin"})
    try:
        out = subprocess.run(
            spec.argv, env=spec.env, user=spec.uid, group=spec.uid, extra_groups=[] if spec.uid is not None else None,
            capture_output=True, text=True, timeout=30, cwd="/", check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Bash sandbox could not start: {exc}"
    if out.returncode != 0:
        return f"the Bash sandbox could not start ({settings.LOOMCYCLE.bash_bwrap}): {out.stderr.strip()[-300:]}"
    return None


UNSANDBOXED = (
    "Bash runs UNSANDBOXED (LOOMCYCLE_BASH_UNSANDBOXED=1): each command runs as the worker's own user, "
    "with its files and network; trusted operators only"
)


def operator_warning() -> str | None:
    """What `up` and `doctor` say about the Bash sandbox: None when Bash is off, or sandboxed and working."""
    conf = settings.LOOMCYCLE
    if not conf.bash_enabled:
        return None
    return UNSANDBOXED if conf.bash_unsandboxed else probe()
