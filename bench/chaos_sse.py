"""SSE consumers of the large chaos run (bench/chaos.py): one thread per run,
reading `GET /v1/runs/{id}/stream` from one of the web processes. When its
web process dies mid-stream, the reader reattaches to a live one from the
last seq it saw (`?from_seq=`), as a client of the API would, and records how
long it was without a stream. Afterwards `check` compares what it saw with
the run's persisted events: each frame once, in seq order, none missing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from apps.runs.models import RunEvent

TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Reader:
    run_id: str
    bases: Callable[[], list[str]]  # the live web processes' base URLs, read at each (re)attach
    first: int  # which web to start on
    deadline: float  # time.monotonic() past which the reader gives up
    seqs: list[int] = field(default_factory=list)
    attaches: int = 0
    reattach_s: list[float] = field(default_factory=list)  # broken stream -> next stream opened
    errors: list[str] = field(default_factory=list)
    base: str = ""  # the web serving the stream now ("" between streams)
    finished: bool = False
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"sse-{self.run_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i, broken_at = self.first, None
        while not self.finished and time.monotonic() < self.deadline:
            bases = self.bases()
            base = bases[i % len(bases)]
            try:
                broken_at = self._attach(base, broken_at)
            except httpx.TransportError:  # the web process died (or was restarting): reattach elsewhere
                broken_at = broken_at or time.monotonic()
                i += 1
                time.sleep(0.2)
            finally:
                self.base = ""
        if not self.finished:
            self.errors.append(f"gave up at seq {self.seqs[-1] if self.seqs else 0}")

    def _attach(self, base: str, broken_at: float | None) -> float | None:
        """One stream from `last seq`; returns when it ends. The time it broke, if still unset."""
        params = {"from_seq": self.seqs[-1] if self.seqs else 0}
        timeout = httpx.Timeout(10.0, read=60.0)
        with httpx.stream("GET", f"{base}/v1/runs/{self.run_id}/stream", params=params, timeout=timeout) as resp:
            if resp.status_code != 200:
                self.errors.append(f"{resp.status_code} on attach to {base}")
                time.sleep(1.0)
                return broken_at
            self.base, self.attaches = base, self.attaches + 1
            if broken_at is not None:
                self.reattach_s.append(time.monotonic() - broken_at)
            for line in resp.iter_lines():
                if line.startswith("id: "):
                    self.seqs.append(int(line[4:]))
        status = httpx.get(f"{base}/v1/runs/{self.run_id}", timeout=10).json().get("status")
        self.finished = status in TERMINAL  # a clean end while live: the stream's lifetime ended
        return None

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def check(reader: Reader) -> list[str]:
    """What the reader saw against the persisted events it should have: every seq but the
    system prompt's (which is never a frame), each once, in order."""
    rows = RunEvent.objects.filter(run_id=reader.run_id).exclude(type="system_prompt").order_by("seq")
    due = list(rows.values_list("seq", flat=True))
    out = [f"SSE reader of {reader.run_id}: {e}" for e in reader.errors if not e.startswith("429")]
    if reader.seqs != due:
        dupes = sorted({s for s in reader.seqs if reader.seqs.count(s) > 1})
        out.append(
            f"SSE reader of {reader.run_id}: saw {len(reader.seqs)} frames, {len(due)} due; "
            f"duplicates {dupes[:5]}, missing {sorted(set(due) - set(reader.seqs))[:5]}"
        )
    return out
