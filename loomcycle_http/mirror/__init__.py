"""`loomcycle mirror DIR`: a plain-file view of a runtime, kept up to date over HTTP, and an
inbox per agent (docs/cli.md). The runtime's Postgres stays the truth: DIR can be deleted and
rebuilt.

Invariants:
- One mirror per DIR at a time (`DIR/.mirror.lock`, an advisory `flock`).
- A pass is: every run's files (`runs.RunMirror`), then at most one inbox file per agent
  (`inbox.Inbox`). Between passes the mirror waits `interval` seconds on an event that a
  stop request sets, so SIGINT/SIGTERM end it at once and never mid-write.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loomcycle_http.client import Client, ConnectionFailed, RateLimited, ServerError
from loomcycle_http.mirror.inbox import Inbox
from loomcycle_http.mirror.runs import AGENT_NAME_RE, RunMirror, agent_dir


class MirrorBusy(Exception):
    """Another mirror holds DIR."""


@contextmanager
def dir_lock(root: Path) -> Iterator[None]:
    """Hold `root/.mirror.lock` (released when the process ends, even by SIGKILL)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".mirror.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise MirrorBusy(f"another loomcycle mirror is running on {root}") from exc
        yield
    finally:
        os.close(fd)


class Mirror:
    """Keeps `root` in step with the runtime behind `client`."""

    def __init__(self, client: Client, root: Path, *, log: Callable[[str], None] = lambda _: None) -> None:
        self.client, self.root, self.log = client, root, log
        self.runs = RunMirror(client, root)
        self._waiting: dict[str, str] = {}  # agent → the wait last reported (each is said once)

    def sync_once(self) -> int:
        """One pass; how many inbox files were settled."""
        rows = self.runs.sync()  # only runs whose names are safe paths
        by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_agent[str(row["agent"])].append(row)
        settled = 0
        for name in self._inbox_agents(by_agent):
            done = Inbox(self.client, name, agent_dir(self.root, name)).step(by_agent[name])
            if done is None:
                continue
            file, how = done
            line = f"{name}/inbox/{file}: {how.outcome}{f' ({how.reason})' if how.reason else ''}"
            if how.outcome != "wait":
                settled += 1
                self._waiting.pop(name, None)
            elif self._waiting.get(name) == line:
                continue
            else:
                self._waiting[name] = line
            self.log(line)
        return settled

    def sync_until_settled(self) -> None:
        """Passes until one settles no inbox file (`--once`)."""
        settled = self.sync_once()
        while settled:
            settled = self.sync_once()

    def _inbox_agents(self, by_agent: dict[str, list[dict[str, Any]]]) -> list[str]:
        """Agents with runs, and every `agents/<name>/inbox` on disk (one path segment)."""
        agents_root = self.root / "agents"
        on_disk = {p.parent.name for p in agents_root.glob("*/inbox")} if agents_root.is_dir() else set()
        on_disk = {name for name in on_disk if AGENT_NAME_RE.fullmatch(name)}
        return sorted(on_disk | set(by_agent))

    def run_until(self, stop: threading.Event, interval: float) -> None:
        """Pass after pass until `stop` is set; an unreachable runtime, a 429 or a 5xx is
        reported on the log and retried next pass (other refusals end the mirror)."""
        while not stop.is_set():
            try:
                settled = self.sync_once()
            except ConnectionFailed as exc:
                self.log(f"cannot reach the runtime ({exc.message}); retrying in {interval:g} s")
                settled = 0
            except (RateLimited, ServerError) as exc:
                self.log(f"the runtime refused for now ({exc.code}: {exc.message}); retrying in {interval:g} s")
                settled = 0
            if not settled:  # a settled file may have a successor waiting: go again at once
                stop.wait(interval)


__all__ = ["Client", "Mirror", "MirrorBusy", "dir_lock"]
