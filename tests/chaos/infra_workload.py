"""The mixed workload of the infrastructure-restart runs (issue 25), driven through the public
API of an `InfraStack` (tests/chaos/infra.py), and the engine's contract checked through SQL.

Kinds of runs, each caught mid-flight by a restart:
- tool runs: `steps` model turns with mock latency, each publishing one channel message and
  writing one memory key (side effects counted exactly once afterwards);
- parents parked on a child (the child parked on the same channel wait as the waiters);
- channel waiters parked on an `await` of `infra-wake`, woken by a publish after the fault;
- interactive runs parked on input, answered after the fault, then cancelled;
- askers parked on an Interruption ask, resolved after the fault;
- an SSE follower of one tool run, which resumes from its last seq when its stream breaks
  and must see every event once, in order, up to the run's end (never hang).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.chaos.harness import wait_until
from tests.chaos.infra import InfraStack

TERMINAL = ("completed", "failed", "cancelled")
ASK = {"op": "ask", "question": "Proceed?", "options": ["yes", "no"]}


def _script(steps: list[dict[str, Any]]) -> str:
    return "MOCK_SCRIPT: " + json.dumps(steps)


def _effects(tag: str, steps: int, sleep_ms: int) -> list[dict[str, Any]]:
    return [
        {
            "sleep_ms": sleep_ms,
            "tools": [
                {"tool": "Channel", "input": {"op": "publish", "channel": "chaos-effects", "value": f"{tag}:{s}"}},
                {"tool": "Memory", "input": {"op": "set", "scope": "user", "key": f"infra/{tag}/{s}", "value": s}},
            ],
        }
        for s in range(steps)
    ]


@dataclass
class SseFollower:
    """Follows one run's SSE stream on a thread; on a broken stream, resumes after its last seq."""

    base_url: str
    run_id: str
    headers: dict[str, str] = field(default_factory=dict)  # a cluster's bearer (tests/netns_cluster.py)
    alternates: list[str] = field(default_factory=list)  # other web processes, tried in turn when a stream breaks
    seqs: list[int] = field(default_factory=list)
    served_by: list[str] = field(default_factory=list)  # the web process each seq came from
    read_timeout: float = 30.0  # a keepalive comes at least every 30 s: a longer silence is a hang
    resumes: int = 0
    errors: list[str] = field(default_factory=list)
    ended_at: float | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name=f"sse-{self.run_id}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if self._read_once():
                    self.ended_at = time.monotonic()
                    return
            except httpx.HTTPError as exc:  # a broken stream: resume after the last seq seen
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if self.alternates:  # on the next web process, as a load balancer would send it
                    self.alternates.append(self.base_url)
                    self.base_url = self.alternates.pop(0)
            self.resumes += 1
            time.sleep(0.5)  # a client's reconnect backoff
        self.errors.append("stream did not end within 300 s")

    def _read_once(self) -> bool:
        """One connection; True once the server ended the stream cleanly."""
        resume = {"Last-Event-ID": str(self.seqs[-1])} if self.seqs else {}  # as EventSource re-attaches
        url = f"{self.base_url}/v1/runs/{self.run_id}/stream"
        timeout = httpx.Timeout(self.read_timeout)
        with httpx.stream("GET", url, headers={**self.headers, **resume}, timeout=timeout) as r:
            if r.status_code != 200:
                self.errors.append(f"status {r.status_code}: {r.read()[:200]!r}")
                return False
            for line in r.iter_lines():
                if line.startswith("id: "):
                    self.seqs.append(int(line[4:]))
                    self.served_by.append(self.base_url)
        return True

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


@dataclass
class Workload:
    tool_runs: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    waiters: list[str] = field(default_factory=list)
    chats: list[str] = field(default_factory=list)
    askers: list[str] = field(default_factory=list)
    steps: int = 0
    followers: list[SseFollower] = field(default_factory=list)

    def everything(self) -> list[str]:
        return [*self.tool_runs, *self.parents, *self.waiters, *self.chats, *self.askers]


def _post(http: httpx.Client, agent: str, prompt: str, **extra: Any) -> str:
    resp = http.post(
        "/v1/runs", json={"agent": agent, "prompt": prompt, "user_id": "infra", "background": True, **extra}
    )
    assert resp.status_code == 202, resp.text
    return str(resp.json()["run_id"])


def workload_start(
    http: httpx.Client, stack: InfraStack, *, tag: str, tool_runs: int = 8, steps: int = 4, each: int = 2
) -> Workload:
    """Start every kind of run (`each` of the parked kinds) and one SSE follower."""
    w = Workload(steps=steps)
    purged = http.post("/v1/_channels/infra-wake/purge", json={})  # an earlier phase's wake must not answer this one's
    assert purged.status_code < 300, purged.text
    w.tool_runs = [
        _post(http, "chaos", _script([*_effects(f"{tag}{i}", steps, 300), {"text": "done"}])) for i in range(tool_runs)
    ]
    wait = {"tool": "Channel", "input": {"op": "await", "channels": ["infra-wake"], "wait_ms": 600_000}}
    child = _script([wait, {"text": "child done"}])  # parked until the wake, so its parent is too
    spawn = {"tool": "Agent", "input": {"op": "spawn", "name": "infra", "prompt": child}}
    w.parents = [_post(http, "infra", _script([spawn, {"text": "parent done"}])) for _ in range(each)]
    w.waiters = [_post(http, "infra", _script([wait, {"text": "woken"}])) for _ in range(each)]
    turns = _script([{"text": "t1"}, {"text": "t2"}])
    w.chats = [_post(http, "chaos", turns, interactive=True) for _ in range(each)]
    ask = {"tools": [{"tool": "Interruption", "input": ASK}]}
    w.askers = [_post(http, "infra", _script([ask, {"text": "answered"}])) for _ in range(each)]
    w.followers = [SseFollower(stack.base_url, w.tool_runs[0], headers=stack.headers)]
    for follower in w.followers:
        follower.start()
    return w


def statuses(stack: InfraStack, run_ids: list[str]) -> dict[str, str]:
    return dict(stack.sql("SELECT id, status FROM runs_run WHERE id = ANY(%s)", (run_ids,)))  # type: ignore[arg-type]


def wait_parked(stack: InfraStack, w: Workload, timeout: float = 60) -> None:
    """Every parked kind has parked (the parents on their child, the others on their wait)."""
    expected = {
        **dict.fromkeys(w.parents, "waiting_children"),
        **dict.fromkeys(w.waiters, "waiting_channel"),
        **dict.fromkeys(w.chats, "awaiting_input"),
        **dict.fromkeys(w.askers, "awaiting_interrupt"),
    }
    wait_until(lambda: statuses(stack, list(expected)) == expected, timeout, "the parked runs parking")


def unpark(http: httpx.Client, stack: InfraStack, w: Workload) -> None:
    """Answer every parked wait through the API: one publish, each chat's input, each ask."""
    resp = http.post("/v1/_channels/infra-wake/publish", json={"payload": "wake"})
    assert resp.status_code < 300, resp.text
    for run_id in w.chats:
        wait_until(lambda r=run_id: statuses(stack, [r])[r] == "awaiting_input", 60, f"chat {run_id} parked")
        resp = http.post(f"/v1/runs/{run_id}/input", json={"text": "go on"})
        assert resp.status_code in (200, 202), resp.text
    for run_id in w.askers:
        rows = wait_until(
            lambda r=run_id: stack.sql("SELECT id FROM runs_interrupt WHERE run_id = %s", (r,)), 60, "ask"
        )
        resp = http.post(f"/v1/runs/{run_id}/interrupts/{rows[0][0]}/resolve", json={"answer": "yes"})
        assert resp.status_code < 300, resp.text


def finish(http: httpx.Client, stack: InfraStack, w: Workload, timeout: float = 120) -> None:
    """Cancel the chats once they parked on their second turn; wait until every run is terminal."""
    for run_id in w.chats:
        wait_until(
            lambda r=run_id: (
                stack.sql("SELECT count(*) FROM runs_runevent WHERE run_id = %s AND type = 'awaiting_input'", (r,))[0][
                    0
                ]
                >= 2
            ),
            timeout,
            f"chat {run_id} answered",
        )
        agent_id = stack.sql("SELECT agent_id FROM runs_run WHERE id = %s", (run_id,))[0][0]
        assert http.post(f"/v1/agents/{agent_id}/cancel", json={}).status_code == 200
    ids = w.everything()
    wait_until(lambda: set(statuses(stack, ids).values()) <= set(TERMINAL), timeout, "every run terminal")
    for follower in w.followers:
        follower.join(timeout)


def _check(violations: list[str], ok: bool, message: str) -> None:
    if not ok:
        violations.append(message)


def contract_violations(stack: InfraStack, w: Workload, tag: str) -> list[str]:
    """The small chaos run's invariants (tests/chaos/test_chaos_small.py), through SQL; [] = none broken."""
    out: list[str] = []
    ids = w.everything()
    children = [r for (r,) in stack.sql("SELECT id FROM runs_run WHERE parent_id = ANY(%s)", (w.parents,))]
    status = statuses(stack, [*ids, *children])
    ended_as = {**dict.fromkeys([*w.tool_runs, *w.parents, *w.waiters, *w.askers, *children], "completed")}
    ended_as.update(dict.fromkeys(w.chats, "cancelled"))
    _check(out, status == ended_as, f"runs not ended as their kind should: {_diff(status, ended_as)}")
    _check(out, len(children) == len(w.parents), f"{len(children)} children for {len(w.parents)} parents")
    everyone = [*ids, *children]
    gaps = stack.sql(
        "SELECT run_id, array_agg(seq ORDER BY seq) FROM runs_runevent WHERE run_id = ANY(%s) GROUP BY run_id "
        "HAVING min(seq) <> 1 OR max(seq) <> count(*) OR count(DISTINCT seq) <> count(*)",
        (everyone,),
    )
    _check(out, not gaps, f"event seqs not consecutive: {gaps[:3]}")
    idx_gaps = stack.sql(
        "SELECT run_id FROM runs_transcriptentry WHERE run_id = ANY(%s) GROUP BY run_id "
        "HAVING min(idx) <> 0 OR max(idx) <> count(*) - 1 OR count(DISTINCT idx) <> count(*)",
        (everyone,),
    )
    _check(out, not idx_gaps, f"transcript idxs not consecutive: {idx_gaps[:3]}")
    dup_calls = stack.sql(
        "SELECT run_id, call_id FROM runs_toolcallrecord WHERE run_id = ANY(%s) GROUP BY 1, 2 HAVING count(*) > 1",
        (everyone,),
    )
    _check(out, not dup_calls, f"tool calls recorded twice: {dup_calls[:3]}")
    unfinished = stack.sql(
        "SELECT run_id, name, status, is_error FROM runs_toolcallrecord WHERE run_id = ANY(%s) "
        "AND (status <> 'finished' OR is_error)",
        (w.tool_runs,),
    )
    _check(out, not unfinished, f"tool calls unfinished or failed: {unfinished[:3]}")
    held = stack.sql(
        "SELECT id FROM runs_run WHERE id = ANY(%s) AND (lease_owner <> '' OR lease_until IS NOT NULL)", (everyone,)
    )
    _check(out, not held, f"leases left held: {held[:3]}")
    unreported = stack.sql("SELECT id FROM runs_run WHERE id = ANY(%s) AND NOT reported_to_parent", (children,))
    _check(out, not unreported, f"children not reported to their parent: {unreported}")
    expected = sorted(f"{tag}{i}:{s}" for i in range(len(w.tool_runs)) for s in range(w.steps))
    published = sorted(
        p
        for (p,) in stack.sql(
            "SELECT payload #>> '{}' FROM agent_channels_channelmessage WHERE channel = 'chaos-effects' "
            "AND payload #>> '{}' LIKE %s",
            (f"{tag}%",),
        )
    )
    _check(out, published == expected, f"channel side effects {len(published)}, expected {len(expected)} exactly once")
    keys = stack.sql("SELECT count(*) FROM memory_memoryentry WHERE key LIKE %s", (f"infra/{tag}%",))[0][0]
    _check(out, keys == len(expected), f"memory side effects {keys}, expected {len(expected)}")
    out += _stream_violations(stack, w)
    return out


def _stream_violations(stack: InfraStack, w: Workload) -> list[str]:
    out: list[str] = []
    for f in w.followers:
        rows = stack.sql(
            "SELECT seq FROM runs_runevent WHERE run_id = %s AND type <> 'system_prompt' ORDER BY seq", (f.run_id,)
        )
        committed = [seq for (seq,) in rows]
        _check(out, f.ended_at is not None, f"SSE stream of {f.run_id} never ended: {f.errors[-3:]}")
        _check(
            out, f.seqs == committed, f"SSE stream of {f.run_id} saw {len(f.seqs)} events, {len(committed)} committed"
        )
    return out


def _diff(got: dict[str, str], want: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    return {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}


def next_event_delays(stack: InfraStack, run_ids: list[str], since: Any, timeout: float) -> list[float]:
    """Seconds from `since` (Postgres's clock) to each run's first event after it, waiting at
    most `timeout` for each (the recovery figure of a fault)."""
    out: list[float] = []
    for run_id in run_ids:
        first = wait_until(
            lambda r=run_id: stack.sql(
                "SELECT min(created_at) FROM runs_runevent WHERE run_id = %s AND created_at > %s", (r, since)
            )[0][0],
            timeout,
            f"run {run_id} progressing after the fault",
        )
        out.append((first - since).total_seconds())
    return out
