#!/usr/bin/env python
"""Capacity on one host (`make capacity`, issue 25): three measurements, each
on the runtime exactly as `make run` starts it (`manage.py up`: web, workers,
beat; Flower off), on its own embedded Postgres/Redis under
.loomcycle/capacity, tuned only by documented settings.

- incall: CAPACITY_INCALL_RUNS (5,000) runs created at once (through the
  services the API calls, CAPACITY_CREATORS threads), each one mock-script
  provider call of CAPACITY_INCALL_MS (120,000) ms: longer than creating the
  5,000 takes (10-70 s on the 2-core host), so that the peak counts the calls
  the workers hold, not the rate at which the bench creates runs (with 10 s
  calls the first ones end before the last are created). Measured: the peak number
  in the call at the same moment, counted from each run's own row (its claim
  `started_at` -> its commit `completed_at`, Postgres's clock, a sweep over
  the intervals: the call plus its claim and commit bookkeeping); the
  workers' RSS (peak, sampled every 0.5 s); Postgres connections of the
  runtime (pg_stat_activity, the bench's own excluded, peak); the time to
  drain (first create -> last run completed). Run at the default worker
  threads and, when CAPACITY_INCALL_CONCURRENCY is set (0, the default, skips
  it), again at that many threads per process (`LOOMCYCLE_WORKER_CONCURRENCY`):
  the engine holds a worker thread through each provider call, so threads cap
  the runs in call.
- parked: up to CAPACITY_PARKED_RUNS (100,000) interactive runs, created
  until CAPACITY_PARKED_BUDGET_S (1,500 s) runs out, each parked at
  `awaiting_input` after its first turn. Measured: the creation rate (first
  create -> every created run parked), the workers' RSS idle before and after,
  the runs tables' size per parked run (pg_total_relation_size of every
  runs_* table, after - before, over the runs), then CAPACITY_ANSWER_PCT (10)
  % of them answered at once through `run_input` (the service behind
  `POST /v1/runs/{id}/input`, CAPACITY_ANSWERERS threads): per run, the
  answer sent -> its next `awaiting_input` event (p50/p100), and all done.
- cancel: CAPACITY_CANCEL_RUNS (1,000) runs each inside a CAPACITY_CANCEL_MS
  (120,000) ms mock call, on CAPACITY_CANCEL_CONCURRENCY (600) threads per
  worker process so that all are in the call at once; once every run has
  been claimed, each is cancelled through `POST /v1/agents/{id}/cancel`
  (CAPACITY_CANCEL_CLIENTS (8) HTTP clients). Latency: the request sent ->
  the run's terminal `done {cancelled: true}` event (p50/p99/max), and each
  request's HTTP round trip (p50/p99).

Every phase prints its figures with the host's load average (1 min, peak
sampled) and CPU steal over the phase, and appends them to
.loomcycle/capacity/results.jsonl. CAPACITY_SUITE: all (default) | incall |
parked | cancel. Every wait is bounded; `up` (and through it every child) and
the embedded servers are stopped on the way out, also on failure or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "capacity"
SUITE = os.environ.get("CAPACITY_SUITE", "all")
PORT = int(os.environ.get("CAPACITY_PORT", "8797"))
CREATORS = int(os.environ.get("CAPACITY_CREATORS", "8"))
INCALL_RUNS = int(os.environ.get("CAPACITY_INCALL_RUNS", "5000"))
INCALL_MS = int(os.environ.get("CAPACITY_INCALL_MS", "120000"))
INCALL_CONCURRENCY = int(os.environ.get("CAPACITY_INCALL_CONCURRENCY", "0"))
PARKED_RUNS = int(os.environ.get("CAPACITY_PARKED_RUNS", "100000"))
PARKED_BUDGET_S = float(os.environ.get("CAPACITY_PARKED_BUDGET_S", "1500"))
ANSWER_PCT = float(os.environ.get("CAPACITY_ANSWER_PCT", "10"))
ANSWERERS = int(os.environ.get("CAPACITY_ANSWERERS", "16"))
CANCEL_RUNS = int(os.environ.get("CAPACITY_CANCEL_RUNS", "1000"))
CANCEL_MS = int(os.environ.get("CAPACITY_CANCEL_MS", "120000"))
CANCEL_CONCURRENCY = int(os.environ.get("CAPACITY_CANCEL_CONCURRENCY", "600"))
CANCEL_CLIENTS = int(os.environ.get("CAPACITY_CANCEL_CLIENTS", "8"))
BENCH_APP = "capacity-bench"  # libpq application_name of the bench's own connections

from bench import stack  # noqa: E402

SERVICES = stack.boot(
    DATA,
    stack.ROOT / "loomcycle.yaml",
    stack.BENCH / "capacity.yaml",
    LOOMCYCLE_FLOWER_ENABLED="0",
    LOOMCYCLE_LISTEN_ADDR=f"127.0.0.1:{PORT}",
    PGAPPNAME=BENCH_APP,
)
import psycopg  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Count, Max  # noqa: E402

from apps.core.types import Principal  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.models import Run, RunEvent, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from bench.stack import pct  # noqa: E402
from loomcycle_project import env as E  # noqa: E402

OPS = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))
TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


# --- the stack: `manage.py up` as `make run` starts it --------------------------------------


@dataclass
class Up:
    """One `manage.py up` child; its workers are the `celery ... worker` processes below it."""

    concurrency: int | None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PGAPPNAME": "loomcycle"}
        if self.concurrency is not None:
            env["LOOMCYCLE_WORKER_CONCURRENCY"] = str(self.concurrency)
        log = (DATA / "up.log").open("ab")
        argv = [sys.executable, "manage.py", "up"]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_ready(120)

    def _wait_ready(self, timeout: float) -> None:
        """/healthz answers and every worker process answers a ping."""
        from workers.celery import app

        deadline, want = time.monotonic() + timeout, int(os.environ.get("LOOMCYCLE_WORKER_PROCESSES", "2"))
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SystemExit(f"manage.py up exited ({self.proc.returncode}); see {DATA}/up.log")
            if _healthz() and len(app.control.ping(timeout=1.0) or []) >= want:
                return
            time.sleep(0.5)
        raise SystemExit(f"the stack did not come up in {timeout} s; see {DATA}/up.log")

    def workers(self) -> list[psutil.Process]:
        assert self.proc is not None
        kids = psutil.Process(self.proc.pid).children(recursive=True)
        return [p for p in kids if " worker " in " ".join(_cmdline(p))]

    def worker_rss_mib(self) -> float:
        total = 0
        for p in self.workers():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total / 2**20

    def stop(self) -> None:
        """SIGTERM to `up` (it stops its children, SIGKILL after its grace); the group is killed past 60 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.NoSuchProcess:
        return []


def _healthz() -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running(concurrency: int | None) -> Iterator[Up]:
    up = Up(concurrency)
    try:
        up.start()
        yield up
    finally:
        up.stop()


# --- sampling -------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Every 0.5 s on its own thread: workers' RSS, the runtime's Postgres connections, load (peaks)."""

    up: Up
    rss_peak: float = 0.0
    conns_peak: int = 0
    load_peak: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._host0 = psutil.cpu_times()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        self.steal = host_steal_pct(self._host0, psutil.cpu_times())

    def _loop(self) -> None:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not self._stop.wait(0.5):
                self.rss_peak = max(self.rss_peak, self.up.worker_rss_mib())
                self.conns_peak = max(self.conns_peak, runtime_connections(conn))
                self.load_peak = max(self.load_peak, os.getloadavg()[0])


def runtime_connections(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name <> %s",
        [BENCH_APP],
    ).fetchone()
    return int(row[0]) if row else 0


def host_steal_pct(before: Any, after: Any) -> float:
    from bench.stack import host_steal_pct as steal

    return steal(before, after)


# --- creating and waiting -------------------------------------------------------------------


def sleeper(ms: int) -> services.RunCreate:
    script = [{"text": "done", "sleep_ms": ms}]
    return services.RunCreate(agent="cap-sleeper", segments=[Segment(text="MOCK_SCRIPT: " + json.dumps(script))])


PARKED_CREATE = services.RunCreate(agent="cap-parked", segments=[Segment(text="park after this turn")])


def create_many(data: services.RunCreate, n: int) -> list[str]:
    """`n` runs through run_create, CREATORS threads; each thread gives its connection back at the end."""

    def chunk(count: int) -> list[str]:
        try:
            return [services.run_create(principal=OPS, data=data).id for _ in range(count)]
        finally:
            connection.close()

    sizes = [n // CREATORS + (1 if i < n % CREATORS else 0) for i in range(CREATORS)]
    with ThreadPoolExecutor(CREATORS) as pool:
        return [run_id for part in pool.map(chunk, sizes) for run_id in part]


def wait_until(what: str, done: Callable[[], bool], timeout: float, every: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s; see {DATA}/up.log")
        time.sleep(every)


def count(ids: list[str], **filters: Any) -> int:
    return Run.objects.filter(id__in=ids, **filters).count()


def db_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]  # type: ignore[index,no-any-return]


def peak_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (a sweep; an end before a start at the same instant)."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def context() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "mem_gib": round(psutil.virtual_memory().total / 2**30),
        "load_end": round(os.getloadavg()[0], 1),
    }


def publish(name: str, figures: dict[str, Any]) -> None:
    figures = {"suite": name, **context(), **figures}
    with (DATA / "results.jsonl").open("a") as out:
        out.write(json.dumps(figures) + "\n")
    print(json.dumps(figures, indent=1), flush=True)


# --- 1. in call -----------------------------------------------------------------------------


def incall(concurrency: int | None) -> None:
    label = "default" if concurrency is None else str(concurrency)
    with running(concurrency) as up:
        rss_idle = up.worker_rss_mib()
        with Sampler(up) as s:
            t0 = time.monotonic()
            ids = create_many(sleeper(INCALL_MS), INCALL_RUNS)
            created = time.monotonic() - t0
            threads = E.WORKER_PROCESSES * (concurrency or E.WORKER_CONCURRENCY)
            bound = INCALL_RUNS * INCALL_MS / 1000 / threads * 3 + 600
            wait_until("in-call drain", lambda: count(ids, status__in=TERMINAL) >= len(ids), bound)
            drain = time.monotonic() - t0
        rows = list(Run.objects.filter(id__in=ids).values_list("status", "started_at", "completed_at"))
    statuses = Counter(status for status, _, _ in rows)
    figures = {
        "threads_per_worker": label,
        "runs": len(ids),
        "call_ms": INCALL_MS,
        "create_s": round(created, 1),
        "peak_in_call": peak_overlap([(a, b) for _, a, b in rows if a and b]),
        "drain_s": round(drain, 1),
        "worker_rss_idle_mib": round(rss_idle),
        "worker_rss_peak_mib": round(s.rss_peak),
        "pg_connections_peak": s.conns_peak,
        "statuses": dict(statuses),
        "load_peak": round(s.load_peak, 1),
        "steal_pct": round(s.steal, 1),
    }
    publish("incall", figures)


# --- 2. parked ------------------------------------------------------------------------------


def runs_tables_bytes() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname LIKE 'runs\\_%%'"
        )
        return int(cur.fetchone()[0])  # type: ignore[index]


def create_until(budget_s: float) -> list[str]:
    """Parked runs in chunks of 1,000 until PARKED_RUNS or the budget, whichever first."""
    ids: list[str] = []
    deadline = time.monotonic() + budget_s
    while len(ids) < PARKED_RUNS and time.monotonic() < deadline:
        ids += create_many(PARKED_CREATE, min(1000, PARKED_RUNS - len(ids)))
    return ids


def parked_count(since: datetime) -> int:
    return Run.objects.filter(agent_name="cap-parked", created_at__gte=since, status=RunStatus.AWAITING_INPUT).count()


def parked() -> None:
    with running(None) as up:
        rss_before, bytes_before = up.worker_rss_mib(), runs_tables_bytes()
        with Sampler(up) as s:
            since, t0 = db_now(), time.monotonic()
            ids = create_until(PARKED_BUDGET_S)
            created = time.monotonic() - t0
            wait_until("parking", lambda: parked_count(since) >= len(ids), 1800, every=5.0)
            all_parked = time.monotonic() - t0
            stuck = len(ids) - parked_count(since)
        rss_after = up.worker_rss_mib()
        per_run = (runs_tables_bytes() - bytes_before) / max(1, len(ids))
        answered = answer(ids[: max(1, int(len(ids) * ANSWER_PCT / 100))])
    figures = {
        "target": PARKED_RUNS,
        "parked": len(ids),
        "not_parked": stuck,
        "create_s": round(created, 1),
        "all_parked_s": round(all_parked, 1),
        "rate_per_s": round(len(ids) / all_parked, 1),
        "worker_rss_before_mib": round(rss_before),
        "worker_rss_after_mib": round(rss_after),
        "worker_rss_peak_mib": round(s.rss_peak),
        "pg_connections_peak": s.conns_peak,
        "runs_tables_bytes_per_run": round(per_run),
        **answered,
        "load_peak": round(s.load_peak, 1),
        "steal_pct_creating": round(s.steal, 1),
    }
    publish("parked", figures)


def answer(ids: list[str]) -> dict[str, Any]:
    """Answer `ids` at once (ANSWERERS threads through run_input); per run, sent -> its next awaiting_input."""
    sent: dict[str, float] = {}

    def one(run_id: str) -> None:
        try:
            sent[run_id] = time.time()
            services.run_input(principal=OPS, run_id=run_id, text="next turn")
        finally:
            connection.close()

    host0, t0 = psutil.cpu_times(), time.time()
    with ThreadPoolExecutor(ANSWERERS) as pool:
        list(pool.map(one, ids))
    sending = time.time() - t0
    wait_until("answered runs progressing", lambda: len(progressed(ids)) >= len(ids), 900, every=2.0)
    done = progressed(ids)
    latency = [done[r].timestamp() - sent[r] for r in ids]
    return {
        "answered": len(ids),
        "answer_sending_s": round(sending, 1),
        "progress_p50_s": round(pct(latency, 0.5), 2),
        "progress_p100_s": round(max(latency), 2),
        "all_progressed_s": round(max(d.timestamp() for d in done.values()) - t0, 1),
        "steal_pct_answering": round(host_steal_pct(host0, psutil.cpu_times()), 1),
    }


def progressed(ids: list[str]) -> dict[str, datetime]:
    """Runs with their second awaiting_input event (the answered turn parked again): its time."""
    rows = (
        RunEvent.objects.filter(run_id__in=ids, type="awaiting_input")
        .values("run_id")
        .annotate(n=Count("id"), last=Max("created_at"))
        .filter(n__gte=2)
        .values_list("run_id", "last")
    )
    return dict(rows)


# --- 3. cancel ------------------------------------------------------------------------------


def cancel() -> None:
    with running(CANCEL_CONCURRENCY) as up:
        ids = create_many(sleeper(CANCEL_MS), CANCEL_RUNS)
        wait_until("every run in its call", lambda: count(ids, started_at__isnull=False) >= len(ids), 600)
        # A claimed run's thread is in its mock call within milliseconds (no tool, no other work).
        holders = Counter(Run.objects.filter(id__in=ids).values_list("lease_owner", flat=True))
        agent_ids = dict(Run.objects.filter(id__in=ids).values_list("id", "agent_id"))
        with Sampler(up) as s:
            t0 = time.monotonic()
            sent, answered, codes = cancel_all([agent_ids[r] for r in ids])
            sending = time.monotonic() - t0
            wait_until("every run cancelled", lambda: count(ids, status__in=TERMINAL) >= len(ids), 120)
        ends = cancelled_at(ids)
    by_agent = {agent_ids[r]: r for r in ids}
    latency = [ends[by_agent[a]].timestamp() - t for a, t in sent.items() if by_agent[a] in ends]
    figures = {
        "runs": len(ids),
        "threads_per_worker": CANCEL_CONCURRENCY,
        "lease_holders": dict(holders),
        "http_codes": dict(codes),
        "cancelled_events": len(ends),
        "latency_p50_ms": round(pct(latency, 0.5) * 1000),
        "latency_p99_ms": round(pct(latency, 0.99) * 1000),
        "latency_max_ms": round(max(latency) * 1000),
        "http_round_trip_p50_ms": round(pct(list(answered.values()), 0.5) * 1000),
        "http_round_trip_p99_ms": round(pct(list(answered.values()), 0.99) * 1000),
        "cancels_sent_per_s": round(len(sent) / sending, 1),
        "load_peak": round(s.load_peak, 1),
        "steal_pct": round(s.steal, 1),
    }
    publish("cancel", figures)


def cancel_all(agent_ids: list[str]) -> tuple[dict[str, float], dict[str, float], Counter[int]]:
    """POST /v1/agents/{id}/cancel for each, CANCEL_CLIENTS at a time: each request's send time and
    round trip (s), the status codes."""
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}  # the request's round trip (s)
    codes: Counter[int] = Counter()
    local = threading.local()

    def one(agent_id: str) -> None:
        client = getattr(local, "client", None) or httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=30)
        local.client = client
        sent[agent_id] = time.time()
        codes[client.post(f"/v1/agents/{agent_id}/cancel", json={"reason": "capacity"}).status_code] += 1
        answered[agent_id] = time.time() - sent[agent_id]

    with ThreadPoolExecutor(CANCEL_CLIENTS) as pool:
        list(pool.map(one, agent_ids))
    return sent, answered, codes


def cancelled_at(ids: list[str]) -> dict[str, datetime]:
    rows = RunEvent.objects.filter(run_id__in=ids, type="done", payload__cancelled=True)
    return dict(rows.values_list("run_id", "created_at"))


def main() -> None:
    if SUITE not in ("all", "incall", "parked", "cancel"):
        raise SystemExit(f"CAPACITY_SUITE must be all, incall, parked or cancel, not {SUITE!r}")
    DATA.mkdir(parents=True, exist_ok=True)
    print(f"capacity: suite {SUITE}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; logs in {DATA}", flush=True)
    try:
        if SUITE in ("all", "incall"):
            incall(None)
            if INCALL_CONCURRENCY:
                incall(INCALL_CONCURRENCY)
        if SUITE in ("all", "cancel"):
            cancel()
        if SUITE in ("all", "parked"):
            parked()
    finally:
        connection.close()
        SERVICES.stop()


if __name__ == "__main__":
    main()
