"""The processes of a started runtime, as Linux's /proc shows them (as
PR_SET_PDEATHSIG, this is Linux only; runtime.py refuses other platforms
before anything is spawned).

They are found by parentage (`descendants`), by the session's marker
variable, which every process `up` starts inherits (`marked_processes`, also
once they were reparented: the daemonized Postgres postmaster is never below
`up`), and by what was remembered while `up` lived (`remember`). Postgres's
backends and Redis overwrite their environment with their process title, so
the marker alone misses them: `family` joins all three.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

SESSION_MARKER = "LOOMCYCLE_TESTING_SESSION"  # in the environment of every process of one started runtime


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now (Linux /proc, as PR_SET_PDEATHSIG is)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # the command name may hold spaces and ")"
        except OSError:  # the process exited while we looked: it has no descendants to find
            continue
        out[int(stat.parent.name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now (children, their children, ...)."""
    return _below([pid], _parents())


def _below(pids: list[int], parents: dict[int, int]) -> list[int]:
    found: list[int] = []
    frontier = list(pids)
    while frontier:
        kids = [child for child, parent in parents.items() if parent in frontier]
        found.extend(kids)
        frontier = kids
    return found


def marked_processes(marker: str) -> list[int]:
    """Pids whose environment carries SESSION_MARKER=`marker`: every process a
    started runtime made, wherever it was reparented (zombies have no environment)."""
    needle = f"{SESSION_MARKER}={marker}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # exited while we looked, or another user's: not ours
            continue
    return found


def _alive(pids: list[int]) -> list[int]:
    """The pids of `pids` still running (a zombie has an empty cmdline)."""
    live = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes():
                live.append(pid)
        except OSError:  # gone
            continue
    return live


def _signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited since it was found
            os.kill(pid, signum)


KILL_WAIT_S = 5.0  # for SIGKILLed processes to be gone


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def end_processes(pids: list[int], grace: float) -> None:
    """SIGTERM `pids`, then SIGKILL whichever still runs after `grace` seconds,
    and wait (bounded) until they are gone."""
    _signal_all(pids, signal.SIGTERM)
    _wait_gone(pids, grace)
    _signal_all(_alive(pids), signal.SIGKILL)
    _wait_gone(pids, KILL_WAIT_S)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:  # gone meanwhile
        return "(exited)"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot): with the pid, names one process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except OSError:  # gone
        return None


def remember(pids: list[int]) -> dict[int, str]:
    """pid -> start time, to find these same processes later (never a reused pid)."""
    known = {pid: _start_time(pid) for pid in pids}
    return {pid: started for pid, started in known.items() if started is not None}


def family(marker: str, known: dict[int, str]) -> list[int]:
    """Every live process of one started runtime now: those carrying its
    marker, those remembered (same pid and start time), and all below them."""
    roots = set(marked_processes(marker)) | {pid for pid, started in known.items() if _start_time(pid) == started}
    return _alive(sorted(roots | set(_below(list(roots), _parents()))))
