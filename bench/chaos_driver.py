"""The workload of the large chaos run (bench/chaos.py), driven through the public
HTTP API only: it submits runs (keeping at most `window` of them live), answers
each interactive run once it parked and ends it once it parked again, wakes each
run parked on a channel subscribe by publishing to its user's stream, and
starts an SSE reader for the runs consumed over SSE.

Every request goes to one of the live web processes; a transport error or a
5xx (a fault in progress) is recorded and retried on the next one, bounded.
A retried write first looks in Postgres for what the failed attempt may have
done, so no retry doubles a side effect."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from apps.channels.models import ChannelMessage
from apps.runs.models import TERMINAL, Run, RunEvent, RunStatus
from bench.chaos_sse import Reader
from tests.chaos import harness
from tests.chaos.harness import INBOX, Expected

KINDS = ["tool"] * 9 + ["sse"] * 2 + ["spawn"] * 3 + ["wait"] * 3 + ["chat"] * 3  # one in 20 of each share


def kinds(runs: range, streamed: bool) -> list[tuple[int, str]]:
    """Each run's kind by its index (KINDS in turn); with `streamed`, every run is a tool run read over SSE."""
    return [(i, "sse" if streamed else KINDS[i % len(KINDS)]) for i in runs]


STEPS, SLEEP_MS, CHILD_SLEEP_MS, WAIT_MS = 3, 300, 500, 600_000


@dataclass
class Driver:
    bases: Callable[[], list[str]]
    rng: random.Random
    window: int
    deadline: float
    expect: Expected = field(default_factory=lambda: Expected(steps=STEPS))
    pending: list[tuple[int, str]] = field(default_factory=list)  # (index, kind) of runs not submitted yet
    live: set[str] = field(default_factory=set)
    answered: dict[str, int] = field(default_factory=dict)  # chat run -> 1 answered, 2 ended
    readers: list[Reader] = field(default_factory=list)
    api_errors: list[str] = field(default_factory=list)
    phase: str = ""
    _next_web: int = 0

    # --- requests --------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict[str, Any], done: Callable[[], bool]) -> httpx.Response | None:
        """`method path` on the next live web; on a transport error or a 5xx, retried (60 s at most)
        unless `done()` says the failed attempt took effect. None when `done()` said so."""
        give_up = time.monotonic() + 60
        while True:
            bases = self.bases()
            base, self._next_web = bases[self._next_web % len(bases)], self._next_web + 1
            try:
                resp = httpx.request(method, base + path, json=body, timeout=30)
                if resp.status_code < 500:
                    return resp
                self.api_errors.append(f"[{self.phase}] {method} {path}: {resp.status_code} {resp.text[:200]}")
            except httpx.TransportError as exc:
                self.api_errors.append(f"[{self.phase}] {method} {path}: {type(exc).__name__}")
            if done():
                return None
            if time.monotonic() > give_up:
                raise RuntimeError(f"{method} {path}: no answer within 60 s: {self.api_errors[-1]}")
            time.sleep(0.5)

    def _submit(self, i: int, kind: str) -> None:
        user = f"chaos-{i}"
        body: dict[str, Any] = {"agent": "chaos", "user_id": user, "background": True}
        if kind in ("tool", "sse"):  # a streamed run lasts longer: its reader is mid-stream at a web kill
            body["prompt"] = harness.tool_script(i, STEPS, SLEEP_MS * (5 if kind == "sse" else 1))
        elif kind == "spawn":
            body.update(agent="chaos-spawner", prompt=harness.spawn_script("chaos-leaf", f"leaf {i}", CHILD_SLEEP_MS))
        elif kind == "wait":
            body["prompt"] = harness.wait_script(WAIT_MS)
        else:
            body.update(prompt=harness.chat_script(), interactive=True)
        made = Run.objects.filter(user_id=user, parent__isnull=True)
        resp = self.request("POST", "/v1/runs", body, made.exists)
        run_id = str(resp.json()["run_id"]) if resp is not None else made.values_list("id", flat=True)[0]
        if resp is not None and resp.status_code != 202:
            raise RuntimeError(f"POST /v1/runs: {resp.status_code} {resp.text[:300]}")
        self._track(i, kind, run_id)

    def _track(self, i: int, kind: str, run_id: str) -> None:
        self.live.add(run_id)
        if kind in ("tool", "sse"):
            self.expect.tool_runs[run_id] = i
        elif kind == "spawn":
            self.expect.spawns.append(run_id)
        elif kind == "wait":
            self.expect.waits[run_id] = f"wake {i}"
        else:
            self.expect.chats.append(run_id)
        if kind == "sse":
            reader = Reader(run_id, self.bases, first=len(self.readers), deadline=self.deadline)
            self.readers.append(reader)
            reader.start()

    # --- the loop --------------------------------------------------------------------------

    def tick(self) -> None:
        """One pass: drop finished runs, answer the parked ones, submit up to the window."""
        rows = dict(Run.objects.filter(id__in=list(self.live)).values_list("id", "status"))
        self.live -= {r for r, s in rows.items() if s in TERMINAL}
        for run_id, status in rows.items():
            if status == RunStatus.AWAITING_INPUT and run_id in self.expect.chats:
                self._chat(run_id)
            elif status == RunStatus.WAITING_CHANNEL and run_id in self.expect.waits:
                self._wake(run_id)
        while self.pending and len(self.live) < self.window:
            self._submit(*self.pending.pop(0))

    def _chat(self, run_id: str) -> None:
        state = self.answered.get(run_id, 0)
        parks = RunEvent.objects.filter(run_id=run_id, type="awaiting_input").count()
        if state == 0:
            resp = self.request("POST", f"/v1/runs/{run_id}/input", {"text": "go on"}, lambda: _not_parked(run_id))
            if resp is not None and resp.status_code not in (200, 202):
                raise RuntimeError(f"input to {run_id}: {resp.status_code} {resp.text[:300]}")
            self.answered[run_id] = 1
        elif state == 1 and parks >= 2:
            agent_id = Run.objects.values_list("agent_id", flat=True).get(id=run_id)
            resp = self.request("POST", f"/v1/agents/{agent_id}/cancel", {}, lambda: _terminal(run_id))
            if resp is not None and resp.status_code != 200:
                raise RuntimeError(f"cancel of {run_id}: {resp.status_code} {resp.text[:300]}")
            self.answered[run_id] = 2

    def _wake(self, run_id: str) -> None:
        user = Run.objects.values_list("user_id", flat=True).get(id=run_id)
        value = self.expect.waits[run_id]
        sent = ChannelMessage.objects.filter(channel=INBOX, scope_id=user)
        if sent.exists():
            return  # published already; the wake is under way
        path = f"/v1/users/{user}/channels/{INBOX}/publish"
        resp = self.request("POST", path, {"payload": value}, sent.exists)
        if resp is not None and resp.status_code not in (200, 201, 202):
            raise RuntimeError(f"publish to {user}: {resp.status_code} {resp.text[:300]}")

    def drain(self, timeout: float) -> None:
        """Tick until every submitted run is terminal and nothing is pending (bounded)."""
        harness.wait_until(lambda: self.tick() or (not self.live and not self.pending), timeout, "the runs ending", 0.2)


def _not_parked(run_id: str) -> bool:
    return Run.objects.filter(id=run_id).exclude(status=RunStatus.AWAITING_INPUT).exists()


def _terminal(run_id: str) -> bool:
    return Run.objects.filter(id=run_id, status__in=TERMINAL).exists()
