"""What the chaos runs share (issue 25): the workload's mock scripts, the
faults that act on worker processes and the broker, the recovery measure, and
the engine's contract checked through SQL.

Used by the small run (tests/chaos/test_chaos_small.py, inside pytest on the
session's stack) and the large one (bench/chaos.py, `make chaos`, on its own
embedded Postgres and Redis). Both have Django set up before importing this;
neither imports the other.

The contract (`violations`), each an entry in the list it returns:
- every run is terminal, and each ended as its kind should;
- per-run event seqs consecutive from 1 and transcript idxs from 0, no duplicate;
- each tool_use id in exactly one assistant row and one tool result row of the transcript;
- one tool-call record per (run, call id), every one finished, none an error;
- every side effect exactly once: one channel message per scripted publish,
  one memory key per scripted set, one delivery per channel wait;
- no lease left held; every child reported to its parent, whose call got its answer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from apps.channels.models import ChannelMessage
from apps.core.redis import sync_client
from apps.memory.models import MemoryEntry
from apps.runs.dispatch import enqueue_iteration
from apps.runs.models import RUNNABLE, TERMINAL, Run, RunEvent, RunStatus, ToolCallRecord, TranscriptEntry
from loomcycle_project.db.base import application_name
from workers import held

EFFECTS = "chaos-effects"  # the global channel every tool run publishes to
INBOX = "chaos-inbox"  # the user-scoped channel a waiting run subscribes to (one stream per user)


class Pool(Protocol):
    """What the faults need of a worker pool (tests.procs.WorkerPool is one)."""

    def pids(self) -> list[int]: ...
    def kill(self, pid: int) -> None: ...
    def ensure(self) -> None: ...


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `predicate` until it is truthy (returned), or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


# --- the workload ------------------------------------------------------------------------------


def tool_script(i: int, steps: int, sleep_ms: int) -> str:
    """`steps` model turns, each publishing `<i>:<s>` to EFFECTS and setting memory key chaos/<i>/<s>."""
    turns: list[dict[str, Any]] = [
        {
            "sleep_ms": sleep_ms,
            "tools": [
                {"tool": "Channel", "input": {"op": "publish", "channel": EFFECTS, "value": f"{i}:{s}"}},
                {"tool": "Memory", "input": {"op": "set", "scope": "user", "key": f"chaos/{i}/{s}", "value": s}},
            ],
        }
        for s in range(steps)
    ]
    return "MOCK_SCRIPT: " + json.dumps([*turns, {"text": "done"}])


def chat_script() -> str:
    """An interactive run's two turns: it parks after each."""
    return "MOCK_SCRIPT: " + json.dumps([{"text": "t1"}, {"text": "t2"}])


def wait_script(wait_ms: int) -> str:
    """A run that subscribes to its user's INBOX stream, parks until a publish wakes it, then answers."""
    call = {"op": "subscribe", "channel": INBOX, "wait_ms": wait_ms}
    return "MOCK_SCRIPT: " + json.dumps([{"tool": "Channel", "input": call}, {"text": "woken"}])


def spawn_script(child: str, label: str, sleep_ms: int) -> str:
    """A run that spawns one `child` sub-agent answering `label`, then answers."""
    prompt = "MOCK_SCRIPT: " + json.dumps([{"text": label, "sleep_ms": sleep_ms}])
    call = {"op": "spawn", "name": child, "prompt": prompt}
    return "MOCK_SCRIPT: " + json.dumps([{"tool": "Agent", "input": call}, {"text": "joined"}])


def post_run(http: httpx.Client, body: dict[str, Any]) -> str:
    """POST /v1/runs in the background; the run id."""
    resp = http.post("/v1/runs", json={"user_id": "chaos", "background": True, **body})
    if resp.status_code != 202:
        raise RuntimeError(f"POST /v1/runs: {resp.status_code} {resp.text}")
    return str(resp.json()["run_id"])


# --- the faults ---------------------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault: its kind, when (Postgres's clock) and the runs it hit."""

    kind: str
    at: datetime
    affected: list[str] = field(default_factory=list)
    measured: float | None = None  # its recovery in seconds, where that is not a run's next event


def db_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        now: datetime = cur.fetchone()[0]
        return now


def worker_id(pid: int) -> str:
    """A worker's id from its presence key; "" until it registered."""
    pattern = f"{held.PRESENCE_PREFIX}{os.uname().nodename}:{pid}:*"
    keys = [k.decode() for k in sync_client().scan_iter(pattern)]
    return keys[0].removeprefix(held.PRESENCE_PREFIX) if keys else ""


def in_flight() -> list[str]:
    """Runs a fault can hit: queued or inside an iteration (parked runs wait on the driver)."""
    return list(Run.objects.filter(status__in=RUNNABLE).values_list("id", flat=True))


def leased_by(owner: str) -> list[str]:
    return list(Run.objects.filter(lease_owner=owner).exclude(status__in=TERMINAL).values_list("id", flat=True))


def pick_victim(pool: Pool, rng: random.Random | None = None, keep: int = 0, timeout: float = 60) -> tuple[int, str]:
    """A registered worker holding leases (the busiest, or a random one with `rng`) and its id;
    waits for one (bounded), and until `keep` other workers are registered to take its runs
    over. When nothing is in flight, any registered worker."""

    def pick() -> tuple[int, str] | None:
        owners = {pid: w for pid in pool.pids() if (w := worker_id(pid))}  # "" = not up yet
        if len(owners) <= keep:
            return None
        holding = {pid: Run.objects.filter(lease_owner=w).count() for pid, w in owners.items()}
        busy = [pid for pid, n in holding.items() if n]
        if busy:
            pid = rng.choice(sorted(busy)) if rng else max(busy, key=lambda p: holding[p])
            return pid, owners[pid]
        if owners and not in_flight():
            pid = sorted(owners)[0]
            return pid, owners[pid]
        return None

    found: tuple[int, str] = wait_until(pick, timeout, "a registered worker holding a lease")
    return found


def db_sessions(pid: int, *, active_only: bool = False) -> int:
    """The database sessions of process `pid` (by its application_name, loomcycle_project.db),
    or only those running a statement (`active_only`)."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    with connection.cursor() as cur:
        cur.execute(sql + (" AND state = 'active'" if active_only else ""), [application_name(pid)])
        (count,) = cur.fetchone()
        return int(count)


def kill_worker(pool: Pool, rng: random.Random | None = None, keep: int = 0) -> Fault:
    """SIGKILL a worker holding leases (`keep` others registered), then top the pool up; its
    leased runs are the affected. They are read once the worker's database sessions have
    ended: a claim it sent just before its death still commits, and is counted."""
    victim, owner = pick_victim(pool, rng, keep)
    pool.kill(victim)
    wait_until(lambda: db_sessions(victim) == 0, 30, "the killed worker's database sessions ending")
    fault = Fault("kill_worker", db_now(), leased_by(owner))  # its leases are still its own after the kill
    pool.ensure()
    return fault


def stall_worker(pool: Pool, lease_timeout: float = 60, keep: int = 0) -> Fault:
    """SIGSTOP a worker holding leases (`keep` others registered) until every lease it held
    expired, then SIGCONT: its late commits meet the fence. The affected are the runs it held."""
    victim, owner = pick_victim(pool, keep=keep)
    os.killpg(victim, signal.SIGSTOP)
    try:  # read once the statements it had sent are done: a claim among them is counted
        wait_until(lambda: db_sessions(victim, active_only=True) == 0, 30, "the stalled worker's statements ending")
        fault = Fault("stall_worker", db_now(), leased_by(owner))
        wait_until(
            lambda: not Run.objects.filter(lease_owner=owner, lease_until__gt=timezone.now()).exists(),
            lease_timeout,
            "the stalled worker's leases expiring",
        )
    finally:
        os.killpg(victim, signal.SIGCONT)
    return fault


def duplicate_doorbells(rng: random.Random, runs: int) -> Fault:
    """For up to `runs` live runs, straight into the broker: the current step twice, the step
    before (stale) and the step after (early), in a shuffled order."""
    live = list(Run.objects.exclude(status__in=TERMINAL).values_list("id", "step"))
    picked = rng.sample(live, min(runs, len(live)))
    fault = Fault("doorbells", db_now(), [r for r, _ in picked])
    for run_id, step in picked:
        bells = [step, step, max(step - 1, 0), step + 1]
        rng.shuffle(bells)
        for s in bells:
            enqueue_iteration(run_id, s)
    fault.affected = [r for r in fault.affected if r in set(in_flight())]
    return fault


def next_event_s(fault: Fault) -> list[float]:
    """Seconds from the fault to each affected run's next committed event, where there is one."""
    out = []
    for run_id in fault.affected:
        first = RunEvent.objects.filter(run_id=run_id, created_at__gt=fault.at).order_by("seq").first()
        if first is not None:
            out.append((first.created_at - fault.at).total_seconds())
    return out


def recovery(fault: Fault, timeout: float) -> list[float]:
    """Seconds from the fault to each affected run's next committed event (bounded wait);
    a run that finished by other means (its cancel) counts from its last event."""
    out = []
    for run_id in fault.affected:
        after = RunEvent.objects.filter(run_id=run_id, created_at__gt=fault.at).order_by("seq")
        try:
            first = wait_until(after.first, timeout, f"run {run_id} progressing after {fault.kind}", interval=0.2)
        except TimeoutError as exc:
            row = Run.objects.filter(id=run_id).values("status", "step", "lease_owner", "lease_until", "attempts")[0]
            raise TimeoutError(f"{exc}: {row}") from exc
        out.append((first.created_at - fault.at).total_seconds())
    return out


# --- the contract -------------------------------------------------------------------------------


@dataclass
class Expected:
    """What the workload asked for, by kind of run."""

    tool_runs: dict[str, int] = field(default_factory=dict)  # run id -> its index i
    steps: int = 0
    spawns: list[str] = field(default_factory=list)
    chats: list[str] = field(default_factory=list)
    waits: dict[str, str] = field(default_factory=dict)  # run id -> the value published to wake it
    # Tool runs that failed as designed: hit by at least LOOMCYCLE_MAX_ATTEMPTS worker losses (kills,
    # stalls), so an iteration was started more often than allowed (`gave_up`). Each side effect of
    # theirs happened at most once; they are not due to complete.
    gave_up: dict[str, int] = field(default_factory=dict)  # run id -> its index i

    def completed(self) -> list[str]:
        return [*self.tool_runs, *self.spawns, *self.waits]

    def everything(self) -> list[str]:
        return [*self.completed(), *self.chats, *self.gave_up]


GAVE_UP = "times without committing (its worker was lost each time)"  # apps.runs.engine's reason


def gave_up(expect: Expected, losses: Counter[str], max_attempts: int) -> None:
    """Move the tool runs that failed for their iteration's attempts, having met at least
    `max_attempts` worker losses (`losses`: run id -> kills and stalls that held it), to
    `expect.gave_up`. A run that failed so with fewer losses stays, and is a violation."""
    failed = Run.objects.filter(id__in=list(expect.tool_runs), status=RunStatus.FAILED, error__contains=GAVE_UP)
    for run_id in failed.values_list("id", flat=True):
        if losses[run_id] >= max_attempts:
            expect.gave_up[run_id] = expect.tool_runs.pop(run_id)


def violations(expect: Expected) -> list[str]:
    """Every breach of the contract (module docstring) the workload's runs show; [] when none."""
    runs = expect.everything()
    children = list(Run.objects.filter(parent_id__in=expect.spawns).values_list("id", flat=True))
    return [
        *_statuses(expect, children),
        *(v for run_id in [*runs, *children] for v in _sequences(run_id)),
        *_tool_records(expect),
        *_effects(expect),
        *_waits(expect),
        *_children(expect),
    ]


def _statuses(expect: Expected, children: list[str]) -> list[str]:
    status = dict(Run.objects.filter(id__in=[*expect.everything(), *children]).values_list("id", "status"))
    want = {
        **{r: RunStatus.COMPLETED for r in [*expect.completed(), *children]},
        **{r: RunStatus.CANCELLED for r in expect.chats},
        **{r: RunStatus.FAILED for r in expect.gave_up},
    }
    return [f"run {r}: {status.get(r)} where {w} was due" for r, w in want.items() if status.get(r) != w]


def _sequences(run_id: str) -> list[str]:
    out = []
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    if seqs != list(range(1, len(seqs) + 1)):
        out.append(f"run {run_id}: event seqs not consecutive from 1: {_gaps(seqs, 1)}")
    rows = list(TranscriptEntry.objects.filter(run_id=run_id).order_by("idx").values_list("idx", "role", "content"))
    if [r[0] for r in rows] != list(range(len(rows))):
        out.append(f"run {run_id}: transcript idxs not consecutive from 0: {_gaps([r[0] for r in rows], 0)}")
    uses, results = Counter[str](), Counter[str]()
    for _, role, content in rows:
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use" and role == "assistant":
                uses[block.get("id", "")] += 1
            elif block.get("type") == "tool_result":
                results[block.get("tool_use_id", "")] += 1
    if any(n != 1 for n in uses.values()) or uses != results:
        out.append(f"run {run_id}: a tool_use not once in the transcript with one result: {uses} / {results}")
    lease = Run.objects.filter(id=run_id).values_list("lease_owner", "lease_until").first()
    if lease not in (("", None), None):
        out.append(f"run {run_id}: lease still held: {lease}")
    return out


def _gaps(values: list[int], start: int) -> str:
    dupes = [v for v, n in Counter(values).items() if n > 1]
    missing = sorted(set(range(start, max(values, default=start) + 1)) - set(values))
    return f"duplicates {dupes[:5]}, missing {missing[:5]}"


def _tool_records(expect: Expected) -> list[str]:
    out = []
    records = ToolCallRecord.objects.filter(run_id__in=list(expect.tool_runs))
    twice = list(records.values("run_id", "call_id").annotate(n=Count("id")).filter(n__gt=1).values("run_id")[:5])
    if twice:
        out.append(f"tool-call records repeated for a call id: {twice}")
    if (n := records.count()) != len(expect.tool_runs) * expect.steps * 2:
        out.append(f"{n} tool-call records where {len(expect.tool_runs) * expect.steps * 2} were due")
    if bad := list(records.exclude(status="finished", is_error=False).values("run_id", "name", "status")[:5]):
        out.append(f"tool-call records unfinished or in error: {bad}")
    return out


def _effects(expect: Expected) -> list[str]:
    out = []
    due = Counter(f"{i}:{s}" for i in expect.tool_runs.values() for s in range(expect.steps))
    may = Counter(f"{i}:{s}" for i in expect.gave_up.values() for s in range(expect.steps))
    published = Counter(ChannelMessage.objects.filter(channel=EFFECTS).values_list("payload", flat=True))
    if published - may != due or published - due - may:
        extra, lost = published - due - may, due - published
        out.append(f"channel publishes not exactly once: extra {list(extra)[:5]}, missing {list(lost)[:5]}")
    keys = Counter(MemoryEntry.objects.filter(key__startswith="chaos/").values_list("key", flat=True))
    want = Counter(f"chaos/{k.replace(':', '/')}" for k in due)
    allowed = Counter(f"chaos/{k.replace(':', '/')}" for k in may)
    if keys - allowed != want:
        out.append(
            f"memory keys not exactly once: extra {list(keys - want - allowed)[:5]}, missing {list(want - keys)[:5]}"
        )
    return out


def _waits(expect: Expected) -> list[str]:
    """Each waiting run got its one message, in one delivery, and consumed it from its stream."""
    out = []
    for run_id, value in expect.waits.items():
        got = [
            e["channel"].get("payload_preview")
            for e in RunEvent.objects.filter(run_id=run_id, type="channel_delivery").values_list("payload", flat=True)
        ]
        if got != [json.dumps(value)]:
            out.append(f"waiting run {run_id}: deliveries {got} where one of {value!r} was due")
    return out


def _children(expect: Expected) -> list[str]:
    """Every child reported, and its parent's Agent call answered with the child's text, once."""
    out = []
    for child in Run.objects.filter(parent_id__in=expect.spawns).values("id", "parent_id", "reported_to_parent"):
        if not child["reported_to_parent"]:
            out.append(f"child {child['id']} never reported to its parent {child['parent_id']}")
    for parent in expect.spawns:
        answers = RunEvent.objects.filter(run_id=parent, type="tool_result").count()
        kids = Run.objects.filter(parent_id=parent).count()
        if (answers, kids) != (1, 1):
            out.append(f"spawning run {parent}: {kids} children and {answers} answers where 1 and 1 were due")
    return out


def terminal_count(run_ids: Iterable[str]) -> int:
    ids = list(run_ids)
    return Run.objects.filter(id__in=ids, status__in=TERMINAL).count()
