#!/usr/bin/env python
"""Soak (`make soak DURATION=3600`): the whole runtime as `make run` starts it
(`manage.py up`: Daphne, Celery workers, beat) on its own embedded Postgres and
Redis under .loomcycle/soak, driven through the public HTTP API by a steady mixed
load at a fixed rate, for DURATION seconds.

The load: SOAK_RATE jobs per second (1.0), one every 1/RATE s, cycling through
tool-calling runs (background, and SSE consumers reading their stream to `done`),
sub-agent spawns, memory writes (HTTP PUT, then a run that sets and gets user
Memory), channel waits (a run parks on its user's `soak-inbox` stream; the driver
publishes to it 5 s later over HTTP; the run then publishes to `soak-events`) and
interactive runs answered SOAK_ANSWER_AFTER_S (20) later, then cancelled 10 s after
that. Every model call sleeps the mock latency (100 ms, bench/soak.yaml).

Each SOAK_SAMPLE_S (60): every process's memory (web, each worker, beat: RSS of the
process and its children; Redis: RSS; Postgres: PSS summed over the postmaster and
its backends, because summing RSS counts the shared buffers once per backend), runs
created/completed/failed/cancelled in the interval (Postgres's clock), requests and
non-2xx answers, the host's load average and CPU steal. Per SOAK_WINDOW_S (300): p50
and p99 of the engine's overhead per iteration, as bench/loop.py measures it (the
workers' samples of iteration wall time minus provider time, which includes the mock
latency). At the end: per process, memory after the warm-up (SOAK_WARMUP_S: 300, or a
quarter of a shorter run) against its maximum afterwards, PASS when within
SOAK_RSS_LIMIT (1.5x); the samples as JSON and CSV under .loomcycle/soak/results/.

Knobs (env): SOAK_DURATION (300), SOAK_RATE, SOAK_WORKERS (2), SOAK_CONCURRENCY (32),
SOAK_SAMPLE_S, SOAK_WINDOW_S, SOAK_WARMUP_S, SOAK_RSS_LIMIT, SOAK_ANSWER_AFTER_S.
Loopback only; every wait is bounded; every process started is stopped (also on
Ctrl-C or failure). Exit status 1 when a verdict fails.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".loomcycle" / "soak"
TIMINGS_KEY = "lc:soak:timings"
TERMINAL = ("completed", "failed", "cancelled")
TRUNCATE_RUNS = "TRUNCATE runs_run, runs_runevent, runs_transcriptentry, runs_runinput, runs_toolcallrecord CASCADE"
IN_FLIGHT_SQL = "status NOT IN ('completed', 'failed', 'cancelled')"

REDIS_SERVERS = ("redis-server", "valkey-server")  # the embedded server is Valkey (requirements/embedded.txt)


# --- the maths (pure: tests/bench/test_soak_maths.py) ---------------------------------


def pct(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (as bench/stack.pct): NaN for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def window_stats(samples: Iterable[tuple[float, float]], window_s: float) -> list[dict[str, float]]:
    """(elapsed s, overhead ms) samples grouped into consecutive windows of window_s
    from elapsed 0: one row per window up to the last sample's, empty ones included
    (n 0, NaN percentiles), so a stall shows as a gap rather than vanishing."""
    buckets: dict[int, list[float]] = {}
    for at, value in samples:
        buckets.setdefault(int(at // window_s), []).append(value)
    if not buckets:
        return []
    return [
        {
            "window": i,
            "start_s": i * window_s,
            "n": len(buckets.get(i, [])),
            "p50_ms": pct(buckets.get(i, []), 0.5),
            "p99_ms": pct(buckets.get(i, []), 0.99),
        }
        for i in range(max(buckets) + 1)
    ]


def flat_verdict(series: list[tuple[float, float]], warmup_s: float, limit: float) -> dict[str, Any]:
    """Whether a memory series (elapsed s, MiB) stays flat after the warm-up: the
    baseline is the first sample at or after warmup_s, the peak the maximum of the
    samples from it on; pass when peak <= limit x baseline. With no sample after the
    warm-up there is no verdict (`pass` None)."""
    after = [(t, v) for t, v in series if t >= warmup_s]
    out: dict[str, Any] = {
        "start": series[0][1] if series else float("nan"),
        "end": series[-1][1] if series else float("nan"),
        "max": max((v for _, v in series), default=float("nan")),
    }
    if not after or after[0][1] <= 0:
        return {**out, "baseline": float("nan"), "peak_after": float("nan"), "ratio": float("nan"), "pass": None}
    baseline, peak = after[0][1], max(v for _, v in after)
    return {**out, "baseline": baseline, "peak_after": peak, "ratio": peak / baseline, "pass": peak <= limit * baseline}


# --- knobs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    duration: float = float(os.environ.get("SOAK_DURATION", "300"))
    rate: float = float(os.environ.get("SOAK_RATE", "1.0"))
    workers: int = int(os.environ.get("SOAK_WORKERS", "2"))
    concurrency: int = int(os.environ.get("SOAK_CONCURRENCY", "32"))
    sample_s: float = float(os.environ.get("SOAK_SAMPLE_S", "60"))
    window_s: float = float(os.environ.get("SOAK_WINDOW_S", "300"))
    warmup_s: float = float(os.environ.get("SOAK_WARMUP_S", "0")) or 0.0
    rss_limit: float = float(os.environ.get("SOAK_RSS_LIMIT", "1.5"))
    answer_after_s: float = float(os.environ.get("SOAK_ANSWER_AFTER_S", "20"))

    @property
    def warmup(self) -> float:
        return self.warmup_s or min(300.0, self.duration / 4)


# --- the load ------------------------------------------------------------------------------


def script(steps: list[Any], label: str) -> str:
    return f"soak {label}. MOCK_SCRIPT: " + json.dumps(steps)


CONTEXT_STEPS = [
    {"tool": "Context", "input": {"op": "self"}},
    {"tool": "Context", "input": {"op": "time"}},
    {"tool": "Context", "input": {"op": "self"}},
    {"text": "tools done"},
]


@dataclass
class Driver:
    """Sends the load: one job every 1/rate s from a fixed cycle; follow-ups (the
    channel publish, the interactive answer and cancel) go on a timer heap. Counts
    every request and every non-2xx answer or transport error (kept, the last 200)."""

    base: str
    knobs: Knobs
    client: httpx.Client = field(init=False)
    pool: ThreadPoolExecutor = field(init=False)
    counts: Counter[str] = field(default_factory=Counter)
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    timers: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        limits = httpx.Limits(max_connections=96, max_keepalive_connections=32)
        self.client = httpx.Client(base_url=self.base, timeout=60, limits=limits)
        self.pool = ThreadPoolExecutor(64, thread_name_prefix="soak")

    CYCLE = ("tools", "sse", "spawn", "memory", "channel", "tools", "interactive", "spawn", "memory", "sse")

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def call(self, method: str, path: str, *, label: str, **kw: Any) -> httpx.Response | None:
        self.bump("requests")
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            self.bump("transport_errors")
            self.errors.append(f"{time.strftime('%H:%M:%S')} {label}: {type(exc).__name__}: {exc}")
            return None
        if not 200 <= r.status_code < 300:
            self.bump("non2xx")
            self.errors.append(f"{time.strftime('%H:%M:%S')} {label}: {r.status_code} {r.text[:200]}")
            return None
        return r

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        with self.lock:
            heapq.heappush(self.timers, (time.monotonic() + delay, next(self.seq), fn))

    def due(self) -> list[Callable[[], None]]:
        now, out = time.monotonic(), []
        with self.lock:
            while self.timers and self.timers[0][0] <= now:
                out.append(heapq.heappop(self.timers)[2])
        return out

    def submit(self, fn: Callable[[], object]) -> None:
        def guarded() -> None:
            try:
                fn()
            except Exception as exc:  # a driver bug must show in the figures, not kill the pool thread silently
                self.bump("driver_errors")
                self.errors.append(f"{time.strftime('%H:%M:%S')} driver: {type(exc).__name__}: {exc}")

        self.pool.submit(guarded)

    def start_run(self, body: dict[str, Any], label: str) -> dict[str, Any] | None:
        r = self.call("POST", "/v1/runs", json={**body, "background": True}, label=label)
        return r.json() if r is not None else None

    def tools(self, n: int) -> None:
        self.start_run({"agent": "soak-tools", "prompt": script(CONTEXT_STEPS, f"tools {n}")}, "run tools")

    def sse(self, n: int) -> None:
        """A streaming run read to its `done` frame; a stream that ends without
        one, or with `error`, counts as `sse_incomplete`."""
        self.bump("requests")
        body = {"agent": "soak-tools", "prompt": script(CONTEXT_STEPS, f"sse {n}")}
        last = ""
        try:
            with self.client.stream("POST", "/v1/runs", json=body, timeout=120) as r:
                if r.status_code != 200:
                    r.read()
                    self.bump("non2xx")
                    self.errors.append(f"{time.strftime('%H:%M:%S')} run sse: {r.status_code} {r.text[:200]}")
                    return
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        last = line[7:]
                        if last in ("done", "error"):
                            break
        except httpx.HTTPError as exc:
            self.bump("transport_errors")
            self.errors.append(f"{time.strftime('%H:%M:%S')} run sse: {type(exc).__name__}: {exc}")
            return
        self.bump("sse_done" if last == "done" else "sse_incomplete")
        if last != "done":
            self.errors.append(f"{time.strftime('%H:%M:%S')} run sse: stream ended after {last!r}, not done")

    def spawn(self, n: int) -> None:
        leaf = script([{"tool": "Context", "input": {"op": "time"}}, {"text": "leaf done"}], f"leaf {n}")
        steps = [{"tool": "Agent", "input": {"op": "spawn", "name": "soak-leaf", "prompt": leaf}}, {"text": "joined"}]
        self.start_run({"agent": "soak-parent", "prompt": script(steps, f"parent {n}")}, "run spawn")

    def memory(self, n: int) -> None:
        user, key = f"u{n % 50}", f"k{n % 20}"
        self.call("PUT", f"/v1/_memory/scopes/user/{user}/keys/api-{key}", json={"value": {"n": n}}, label="memory put")
        steps = [
            {"tool": "Memory", "input": {"op": "set", "scope": "user", "key": f"run-{key}", "value": {"n": n}}},
            {"tool": "Memory", "input": {"op": "get", "scope": "user", "key": f"api-{key}"}},
            {"text": "remembered"},
        ]
        self.start_run({"agent": "soak-memory", "prompt": script(steps, f"memory {n}"), "user_id": user}, "run memory")

    def channel(self, n: int) -> None:
        user = f"c{n % 50}"
        steps = [
            {
                "tool": "Channel",
                "input": {"op": "subscribe", "channel": "soak-inbox", "wait_ms": 60000, "max_messages": 1},
            },
            {"tool": "Channel", "input": {"op": "publish", "channel": "soak-events", "value": {"n": n}}},
            {"text": "relayed"},
        ]
        if self.start_run({"agent": "soak-channel", "prompt": script(steps, f"chan {n}"), "user_id": user}, "run chan"):
            path = f"/v1/users/{user}/channels/soak-inbox/publish"
            self.later(5.0, lambda: self.submit(lambda: self._publish(path, n)))

    def _publish(self, path: str, n: int) -> None:
        self.call("POST", path, json={"payload": {"n": n}}, label="channel publish")

    def interactive(self, n: int) -> None:
        steps = [{"text": "first turn"}, {"text": "second turn"}]
        run = self.start_run({"agent": "soak-chat", "prompt": script(steps, f"chat {n}")}, "run chat")
        if run is None:
            return
        run_id, agent_id = run["run_id"], run["agent_id"]
        answer = {"text": f"the answer to {n}, later"}
        self.later(
            self.knobs.answer_after_s,
            lambda: self.submit(lambda: self.call("POST", f"/v1/runs/{run_id}/input", json=answer, label="chat input")),
        )
        self.later(
            self.knobs.answer_after_s + 10,
            lambda: self.submit(
                lambda: self.call(
                    "POST", f"/v1/agents/{agent_id}/cancel", json={"reason": "soak: conversation over"}, label="cancel"
                )
            ),
        )


# --- the stack -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_up(env: dict[str, str], port: int, knobs: Knobs) -> subprocess.Popen[bytes]:
    """`manage.py up` (migrate, load config, then web + workers + beat), output to DATA/up.log."""
    env = {
        **env,
        "LOOMCYCLE_DATA_DIR": str(DATA),
        "LOOMCYCLE_CONFIG_FILES": str(ROOT / "bench" / "soak.yaml"),
        "LOOMCYCLE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "LOOMCYCLE_FLOWER_ENABLED": "0",
        "LOOMCYCLE_ENGINE_TIMINGS_KEY": TIMINGS_KEY,
        "LOOMCYCLE_LOG_LEVEL": "WARNING",
        "LOOMCYCLE_WORKER_PROCESSES": str(knobs.workers),
        "LOOMCYCLE_WORKER_CONCURRENCY": str(knobs.concurrency),
        # A load run: the shipped per-user/per-tenant run caps (64/256) would refuse part of it.
        "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "0",
        "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    log = (DATA / "up.log").open("ab")
    argv = [sys.executable, str(ROOT / "manage.py"), "up"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(base: str, up: subprocess.Popen[bytes], timeout: float) -> None:
    deadline, last = time.monotonic() + timeout, "no answer yet"
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise SystemExit(f"manage.py up exited with {up.returncode}; see {DATA / 'up.log'}")
        try:
            status = httpx.get(base + "/healthz", timeout=2).status_code
        except httpx.HTTPError as exc:  # not listening yet: retried until the deadline, then reported
            last = repr(exc)
        else:
            if status == 200:
                return
            last = f"status {status}"
        time.sleep(0.5)
    raise SystemExit(f"{base}/healthz did not answer 200 within {timeout:.0f} s ({last}); see {DATA / 'up.log'}")


def stop_up(up: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `up` (it stops its children, 20 s grace), then SIGKILL whatever
    of its process tree is left (each child runs in its own session)."""
    try:
        tree = psutil.Process(up.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(5)
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue


def role_of(proc: psutil.Process) -> str | None:
    cmd = proc.cmdline()
    if any("daphne" in c for c in cmd):
        return "web"
    if "worker" in cmd and "-n" in cmd:
        return "worker" + cmd[cmd.index("-n") + 1].split("@")[0].lstrip("w")
    if "beat" in cmd:
        return "beat"
    return None


def tree_rss(proc: psutil.Process) -> float:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def memory_by_role(up: subprocess.Popen[bytes], pg_dir: Path, redis_sock: str) -> dict[str, Any]:
    """MiB per process role, and each role's pid (a changed pid is a restart)."""
    mem: dict[str, float] = {}
    pids: dict[str, int] = {}
    for child in psutil.Process(up.pid).children():
        try:
            role = role_of(child)
            if role:
                mem[role], pids[role] = tree_rss(child), child.pid
        except psutil.NoSuchProcess:
            continue
    pg_pss, backends = 0.0, 0
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        try:
            if (proc.info["name"] or "").startswith("postgres") and str(pg_dir) in " ".join(cmd):
                pg_pss += proc.memory_full_info().pss
                for child in proc.children():
                    pg_pss += child.memory_full_info().pss
                    backends += 1
                pids["postgres"] = proc.pid
            elif (proc.info["name"] or "").startswith(REDIS_SERVERS) and redis_sock in " ".join(cmd):
                mem["redis"], pids["redis"] = proc.memory_info().rss / 2**20, proc.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    mem["postgres"] = pg_pss / 2**20
    return {"mem_mib": mem, "pids": pids, "pg_processes": backends + 1}


# --- sampling ----------------------------------------------------------------------------------

# How each agent's runs must end: the interactive ones by the driver's cancel, the rest completed.
EXPECTED = {"soak-chat": "cancelled"}
# Interactive runs that did not park twice (the first turn, then the driver's later answer).
UNANSWERED_SQL = """
SELECT count(*) FROM runs_run r
WHERE r.agent_name = 'soak-chat'
  AND (SELECT count(*) FROM runs_runevent e WHERE e.run_id = r.id AND e.type = 'awaiting_input') < 2
"""
# Channel runs that took 30 s or more: their wait ended by the 60 s timeout, or a wake came late.
SLOW_WAKE_SQL = """
SELECT count(*) FROM runs_run
WHERE agent_name = 'soak-channel' AND completed_at - created_at >= interval '30 seconds'
"""

COUNTS_SQL = f"""
SELECT now(),
  count(*) FILTER (WHERE created_at > %(t0)s),
  count(*) FILTER (WHERE status = 'completed' AND completed_at > %(t0)s),
  count(*) FILTER (WHERE status = 'failed' AND completed_at > %(t0)s),
  count(*) FILTER (WHERE status = 'cancelled' AND completed_at > %(t0)s),
  count(*) FILTER (WHERE {IN_FLIGHT_SQL}),
  count(*)
FROM runs_run
"""


@dataclass
class Sampler:
    """Takes one sample a minute; keeps every overhead sample with its elapsed time."""

    pg: Any
    redis: Any
    up: subprocess.Popen[bytes]
    driver: Driver
    pg_dir: Path
    redis_sock: str
    t0: float
    pg_t: Any = None
    cpu: Any = field(default_factory=psutil.cpu_times)
    cpu_start: Any = field(default_factory=psutil.cpu_times)
    last_counts: Counter[str] = field(default_factory=Counter)
    overheads: list[tuple[float, float]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pg_t = self.pg.execute("SELECT now()").fetchone()[0]

    def drain_timings(self) -> list[float]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(TIMINGS_KEY, 0, -1)
        pipe.delete(TIMINGS_KEY)
        raw, _ = pipe.execute()
        out = []
        for s in raw:
            total, provider, _admission = (float(x) for x in s.decode().split(","))
            out.append(total - provider)
        return out

    def take(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.t0
        now, created, completed, failed, cancelled, in_flight, total = self.pg.execute(
            COUNTS_SQL, {"t0": self.pg_t}
        ).fetchone()
        self.pg_t = now
        over = self.drain_timings()
        self.overheads.extend((elapsed, v) for v in over)
        cpu = psutil.cpu_times()
        steal = host_steal_pct(self.cpu, cpu)
        self.cpu = cpu
        with self.driver.lock:
            counts = Counter(self.driver.counts)
        delta = {
            k: counts[k] - self.last_counts[k] for k in ("requests", "non2xx", "transport_errors", "sse_incomplete")
        }
        self.last_counts = counts
        mem = memory_by_role(self.up, self.pg_dir, self.redis_sock)
        row = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "created": created,
            "completed": completed,
            "failed": failed,
            "cancelled": cancelled,
            "in_flight": in_flight,
            "runs_total": total,
            **{k: v for k, v in delta.items()},
            "error_rate": (delta["non2xx"] + delta["transport_errors"] + failed) / max(1, delta["requests"]),
            "iterations": len(over),
            "p50_overhead_ms": pct(over, 0.5),
            "p99_overhead_ms": pct(over, 0.99),
            "load1": os.getloadavg()[0],
            "steal_pct": steal,
            "mem_mib": mem["mem_mib"],
            "pids": mem["pids"],
            "pg_processes": mem["pg_processes"],
        }
        self.rows.append(row)
        return row


def host_steal_pct(before: Any, after: Any) -> float:
    fields = [f for f in after._fields if f not in ("guest", "guest_nice")]
    total = sum(getattr(after, f) - getattr(before, f) for f in fields)
    return 100.0 * (getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)) / total if total > 0 else 0.0


def print_row(row: dict[str, Any]) -> None:
    mem = " ".join(f"{k}={v:.0f}" for k, v in sorted(row["mem_mib"].items()))
    print(
        f"[{row['at'][11:19]} +{row['elapsed_s']:6.0f}s] runs +{row['created']} created, {row['completed']} completed, "
        f"{row['failed']} failed, {row['cancelled']} cancelled, {row['in_flight']} in flight | req {row['requests']} "
        f"non2xx {row['non2xx']} transport {row['transport_errors']} | overhead p50 {row['p50_overhead_ms']:.1f} "
        f"p99 {row['p99_overhead_ms']:.1f} ms ({row['iterations']}) | load {row['load1']:.1f} steal "
        f"{row['steal_pct']:.0f}% | MiB {mem}",
        flush=True,
    )


# --- the run -------------------------------------------------------------------------------------


def drive(driver: Driver, sampler: Sampler, knobs: Knobs, stopping: threading.Event) -> None:
    """The steady load for knobs.duration s, one sample per knobs.sample_s."""
    interval = 1.0 / knobs.rate
    t0 = sampler.t0
    next_job, next_sample, n = t0, t0 + knobs.sample_s, 0
    while not stopping.is_set():
        now = time.monotonic()
        if now - t0 >= knobs.duration:
            break
        if now >= next_job:
            driver.submit(_bind(driver, n))
            n += 1
            next_job += interval
        for fn in driver.due():
            fn()
        if now >= next_sample:
            print_row(sampler.take())
            next_sample += knobs.sample_s
        time.sleep(0.02)  # the driver's own tick: jobs go out within 20 ms of their slot


def _bind(driver: Driver, n: int) -> Callable[[], None]:
    kind = driver.CYCLE[n % len(driver.CYCLE)]
    driver.bump(f"job_{kind}")
    method: Callable[[int], None] = getattr(driver, kind)
    return lambda: method(n)


def drain(driver: Driver, sampler: Sampler, knobs: Knobs) -> int:
    """After the load: run the follow-ups still due (answers, cancels, publishes) and
    wait (bounded) for the runs to end; returns the runs still in flight."""
    deadline = time.monotonic() + knobs.answer_after_s + 60
    while time.monotonic() < deadline:
        for fn in driver.due():
            fn()
        with driver.lock:
            pending = len(driver.timers)
        left = sampler.pg.execute(f"SELECT count(*) FROM runs_run WHERE {IN_FLIGHT_SQL}").fetchone()[0]
        if not pending and not left:
            return 0
        time.sleep(0.5)
    driver.pool.shutdown(wait=True, cancel_futures=False)
    return int(sampler.pg.execute(f"SELECT count(*) FROM runs_run WHERE {IN_FLIGHT_SQL}").fetchone()[0])


def summarise(sampler: Sampler, driver: Driver, knobs: Knobs, stuck: int) -> dict[str, Any]:
    rows = sampler.rows
    roles = sorted({r for row in rows for r in row["mem_mib"]})
    memory = {
        role: flat_verdict(
            [(row["elapsed_s"], row["mem_mib"][role]) for row in rows if role in row["mem_mib"]],
            knobs.warmup,
            knobs.rss_limit,
        )
        for role in roles
    }
    restarts = {
        role: len({row["pids"][role] for row in rows if role in row["pids"]}) - 1
        for role in {r for row in rows for r in row["pids"]}
    }
    failures = sampler.pg.execute(
        "SELECT agent_name, left(error, 160), count(*) FROM runs_run WHERE status = 'failed' "
        "GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 10"
    ).fetchall()
    status = dict(sampler.pg.execute("SELECT status, count(*) FROM runs_run GROUP BY 1").fetchall())
    by_agent = sampler.pg.execute(
        "SELECT agent_name, status, count(*) FROM runs_run GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    unexpected = sum(n for agent, st, n in by_agent if st != EXPECTED.get(agent, "completed"))
    (unanswered,) = sampler.pg.execute(UNANSWERED_SQL).fetchone()
    (slow_wakes,) = sampler.pg.execute(SLOW_WAKE_SQL).fetchone()
    requests = driver.counts["requests"]
    bad = driver.counts["non2xx"] + driver.counts["transport_errors"]
    ended = sum(status.get(s, 0) for s in TERMINAL)
    loads = [row["load1"] for row in rows]
    return {
        "host": {
            "cores": os.cpu_count(),
            "load1_mean": sum(loads) / max(1, len(loads)),
            "load1_max": max(loads, default=float("nan")),
            "steal_pct": host_steal_pct(sampler.cpu_start, psutil.cpu_times()),
        },
        "memory": memory,
        "restarts": restarts,
        "windows": [
            {**w, "load1": host_in_window(rows, w["start_s"], knobs.window_s)}
            for w in window_stats(sampler.overheads, knobs.window_s)
        ],
        "overall_p50_ms": pct([v for _, v in sampler.overheads], 0.5),
        "overall_p99_ms": pct([v for _, v in sampler.overheads], 0.99),
        "iterations": len(sampler.overheads),
        "status": status,
        "failed_reasons": [list(f) for f in failures],
        "requests": requests,
        "bad_answers": bad,
        "http_error_rate": bad / max(1, requests),
        "run_failure_rate": status.get("failed", 0) / max(1, ended),
        "stuck_in_flight": stuck,
        "by_agent": [list(r) for r in by_agent],
        "unexpected_end": unexpected,
        "chat_unanswered": unanswered,
        "channel_slow_wakes": slow_wakes,
        "counts": dict(driver.counts),
        "last_errors": list(driver.errors)[-20:],
    }


def host_in_window(rows: list[dict[str, Any]], start_s: float, window_s: float) -> float:
    """The mean 1-minute load average of the samples taken in [start_s, start_s + window_s)."""
    loads = [row["load1"] for row in rows if start_s <= row["elapsed_s"] < start_s + window_s]
    return sum(loads) / len(loads) if loads else float("nan")


def verdicts(summary: dict[str, Any]) -> dict[str, bool]:
    """Memory flat per process; no run left in flight; no process restarted."""
    out = {f"memory {role}": bool(v["pass"]) for role, v in summary["memory"].items() if v["pass"] is not None}
    out["no run stuck in flight"] = summary["stuck_in_flight"] == 0
    out["no process restarted"] = not any(summary["restarts"].values())
    out["every run ended as its kind should"] = summary["unexpected_end"] == 0
    out["every interactive run got its later answer"] = summary["chat_unanswered"] == 0
    out["every channel wait woken by its publish (< 30 s)"] = summary["channel_slow_wakes"] == 0
    return out


def report(summary: dict[str, Any], knobs: Knobs, command: str) -> None:
    print(f"\nsoak: {command}", flush=True)
    print(f"{'process':<10} {'start':>7} {'warm':>7} {'end':>7} {'max':>7} {'peak/warm':>9}  MiB")
    for role, v in summary["memory"].items():
        print(
            f"{role:<10} {v['start']:7.0f} {v['baseline']:7.0f} {v['end']:7.0f} {v['max']:7.0f} {v['ratio']:9.2f}  "
            f"{'PASS' if v['pass'] else ('n/a' if v['pass'] is None else 'FAIL')}"
        )
    print(f"\n{'window':<14} {'iterations':>10} {'p50 ms':>8} {'p99 ms':>8} {'load':>6}  (iteration overhead)")
    for w in summary["windows"]:
        span = f"{w['start_s'] / 60:g}-{(w['start_s'] + knobs.window_s) / 60:g} min"
        print(f"{span:<14} {w['n']:>10} {w['p50_ms']:8.1f} {w['p99_ms']:8.1f} {w['load1']:6.1f}")
    print(
        f"{'all':<14} {summary['iterations']:>10} {summary['overall_p50_ms']:8.1f} {summary['overall_p99_ms']:8.1f}\n"
    )
    print(f"runs by status: {summary['status']}; still in flight after the drain: {summary['stuck_in_flight']}")
    print("by agent: " + ", ".join(f"{a} {st} {n}" for a, st, n in summary["by_agent"]))
    print(
        f"ended otherwise than expected: {summary['unexpected_end']}; interactive runs without their later answer: "
        f"{summary['chat_unanswered']}; channel waits woken after 30 s or more: {summary['channel_slow_wakes']}"
    )
    print(
        f"requests {summary['requests']}, non-2xx or transport errors {summary['bad_answers']} "
        f"({100 * summary['http_error_rate']:.3f} %); failed runs {100 * summary['run_failure_rate']:.3f} % of ended"
    )
    for agent, error, n in summary["failed_reasons"]:
        print(f"  failed {n} x {agent}: {error}")
    for line in summary["last_errors"]:
        print(f"  {line}")
    host = summary["host"]
    print(
        f"host: {host['cores']} cores, load average (1 min) mean {host['load1_mean']:.1f}, "
        f"max {host['load1_max']:.1f}; CPU steal over the run {host['steal_pct']:.1f} %"
    )
    print(f"restarts: {summary['restarts']}")
    for name, ok in summary["verdicts"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print("soak verdict: " + ("PASS" if all(summary["verdicts"].values()) else "FAIL"), flush=True)


def save(rows: list[dict[str, Any]], summary: dict[str, Any], stamp: str) -> Path:
    out = DATA / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"soak-{stamp}.json").write_text(json.dumps({"samples": rows, "summary": summary}, indent=1, default=str))
    roles = sorted({r for row in rows for r in row["mem_mib"]})
    flat = [k for k in rows[0] if k not in ("mem_mib", "pids")] if rows else []
    with (out / f"soak-{stamp}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(flat + [f"{r}_mib" for r in roles])
        for row in rows:
            w.writerow([row[k] for k in flat] + [f"{row['mem_mib'].get(r, float('nan')):.1f}" for r in roles])
    return out / f"soak-{stamp}.json"


def main() -> int:
    knobs = Knobs()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("LOOMCYCLE_DATA_DIR", str(DATA))
    os.environ["LOOMCYCLE_DATA_DIR"] = str(DATA)
    from loomcycle_project.embedded import ensure_services

    services = ensure_services(DATA)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    command = f"make soak DURATION={knobs.duration:.0f} (SOAK_RATE={knobs.rate}, SOAK_WORKERS={knobs.workers})"
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    up: subprocess.Popen[bytes] | None = None
    driver: Driver | None = None
    try:
        import psycopg
        import redis

        pg = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        sock = os.environ["REDIS_URL"].removeprefix("redis+socket://")
        rclient = redis.Redis(unix_socket_path=sock)
        if pg.execute("SELECT to_regclass('runs_run')").fetchone() != (None,):  # a previous soak's rows
            pg.execute(TRUNCATE_RUNS)
        rclient.delete(TIMINGS_KEY, "runs")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        up = start_up(dict(os.environ), port, knobs)
        wait_healthy(base, up, 300)
        print(
            f"loomcycle soak: {os.cpu_count()} cores, up at {base} ({knobs.workers} workers x {knobs.concurrency} "
            f"threads, web, beat); {knobs.rate} jobs/s for {knobs.duration:.0f} s; warm-up {knobs.warmup:.0f} s; "
            f"samples every {knobs.sample_s:.0f} s; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        driver = Driver(base, knobs)
        pg_dir = next(p for p in DATA.iterdir() if p.name == "pg")
        sampler = Sampler(pg, rclient, up, driver, pg_dir, sock, time.monotonic())
        print_row(sampler.take())
        drive(driver, sampler, knobs, stopping)
        stuck = drain(driver, sampler, knobs)
        print_row(sampler.take())
        summary = summarise(sampler, driver, knobs, stuck)
        summary["verdicts"] = verdicts(summary)
        summary["knobs"] = {**knobs.__dict__, "warmup": knobs.warmup, "command": command}
        report(summary, knobs, command)
        print(f"samples: {save(sampler.rows, summary, stamp)} (and .csv)", flush=True)
        return 0 if all(summary["verdicts"].values()) else 1
    finally:
        if driver is not None:
            driver.pool.shutdown(wait=False, cancel_futures=True)
            driver.client.close()
        if up is not None:
            stop_up(up)
        services.stop()


if __name__ == "__main__":
    sys.exit(main())
