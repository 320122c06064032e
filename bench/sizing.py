#!/usr/bin/env python
"""Sizing figures for docs/operations.md "From one machine to many" (`make sizing`): what one
process of each kind costs, on the runtime as `make run` starts it (bench/capacity.py's stack:
`manage.py up` with web, LOOMCYCLE_WORKER_PROCESSES workers on the threads pool, beat; Flower off;
its own embedded Postgres and Redis under .loomcycle/capacity).

- idle: each process's RSS by kind, and its Postgres connections (pg_stat_activity by
  application_name, which is `loomcycle:<pid>` for every runtime process).
- in call: SIZING_INCALL_RUNS (512) runs each one SIZING_INCALL_MS (5,000) ms mock call, more than
  the workers' threads, so some wait queued: the peak Postgres connections per process (sampled every
  0.25 s), the peak runs in their call per worker process (from the runs' own rows: claim to commit,
  grouped by the worker that holds the lease), and the Redis memory the queued doorbells take.
- parked: SIZING_PARKED_RUNS (2,000) interactive runs parked at `awaiting_input`: Redis
  `used_memory` and every key's `MEMORY USAGE` (summed by key prefix) before and after, over the
  runs parked, beside Postgres's runs tables per parked run.

Prints one JSON object and appends it to .loomcycle/capacity/results.jsonl (suite "sizing").
Every wait is bounded; the stack is stopped on the way out, also on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import capacity as cap

INCALL_RUNS = int(os.environ.get("SIZING_INCALL_RUNS", "512"))
INCALL_MS = int(os.environ.get("SIZING_INCALL_MS", "5000"))
PARKED_RUNS = int(os.environ.get("SIZING_PARKED_RUNS", "2000"))

from apps.core.redis import sync_client  # noqa: E402
from apps.runs.models import Run, RunStatus  # noqa: E402


class Up(cap.Up):
    """bench/capacity.py's `up`, with each process naming itself in pg_stat_activity (the
    runtime's default application_name `loomcycle:<pid>`, which capacity's PGAPPNAME replaces)."""

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PGAPPNAME"} | {"PYTHONUNBUFFERED": "1"}
        log = (cap.DATA / "up.log").open("ab")
        argv = [sys.executable, "manage.py", "up"]
        self.proc = subprocess.Popen(
            argv, cwd=cap.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_ready(120)


def kinds(up: cap.Up) -> dict[int, str]:
    """pid -> web | worker | beat for every process `up` started."""
    assert up.proc is not None
    out: dict[int, str] = {}
    for p in psutil.Process(up.proc.pid).children(recursive=True):
        line = " ".join(cap._cmdline(p))
        for kind, mark in (("web", "daphne"), ("worker", " worker "), ("beat", " beat ")):
            if mark in line:
                out[p.pid] = kind
    return out


def connections_by_pid() -> Counter[int]:
    with cap.psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'loomcycle:%%'"
        ).fetchall()
    return Counter(int(name.rpartition(":")[2]) for (name,) in rows if name.rpartition(":")[2].isdigit())


def per_kind(values: dict[int, float], pids: dict[int, str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for pid, kind in pids.items():
        out[kind].append(round(values.get(pid, 0), 1))
    return dict(out)


def rss_mib(pids: dict[int, str]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
    return out


def queued_doorbells() -> int:
    """Messages waiting in the `runs` queue (every priority list), as loomcycle_queue_depth counts them."""
    client = sync_client()
    return sum(int(client.llen(key)) for key in client.scan_iter(match="runs*", count=1000))


def redis_usage() -> tuple[int, dict[str, int]]:
    """used_memory, and MEMORY USAGE summed by key prefix (up to the second ':')."""
    client = sync_client()
    by_prefix: Counter[str] = Counter()
    for key in client.scan_iter(count=1000):
        name = key.decode(errors="replace")
        prefix = ":".join(name.split(":")[:2]) if name.startswith("lc:") else name.split("\x06")[0]
        by_prefix[prefix] += int(client.memory_usage(key) or 0)
    return int(client.info("memory")["used_memory"]), dict(by_prefix)


def incall(up: cap.Up, pids: dict[int, str]) -> dict[str, Any]:
    peak_conns: Counter[int] = Counter()
    peak_redis, peak_queue, peak_queued = 0, 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_redis, peak_queue, peak_queued
        while not stop.wait(0.25):
            for pid, n in connections_by_pid().items():
                peak_conns[pid] = max(peak_conns[pid], n)
            queued = queued_doorbells()
            used, prefixes = redis_usage()
            queue_bytes = sum(v for k, v in prefixes.items() if k.startswith("runs"))
            peak_redis = max(peak_redis, used)
            if queued > peak_queued:
                peak_queued, peak_queue = queued, queue_bytes

    idle_redis, _ = redis_usage()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    ids = cap.create_many(cap.sleeper(INCALL_MS), INCALL_RUNS)
    cap.wait_until("in-call drain", lambda: cap.count(ids, status__in=cap.TERMINAL) >= len(ids), 900)
    stop.set()
    thread.join(30)
    rows = list(Run.objects.filter(id__in=ids).values_list("started_at", "completed_at"))
    return {
        "incall_runs": len(ids),
        "incall_peak_in_call_all_workers": cap.peak_overlap([(a, b) for a, b in rows if a and b]),
        "incall_pg_connections_peak_by_kind": per_kind(dict(peak_conns), pids),
        "incall_redis_used_peak_over_idle_bytes": peak_redis - idle_redis,
        "incall_doorbells_queued_peak": peak_queued,
        "incall_redis_queue_keys_bytes_at_that_peak": peak_queue,
    }


def parked() -> dict[str, Any]:
    used0, prefixes0 = redis_usage()
    tables0 = cap.runs_tables_bytes()
    since = cap.db_now()
    ids = cap.create_many(cap.PARKED_CREATE, PARKED_RUNS)
    cap.wait_until("parking", lambda: cap.parked_count(since) >= len(ids), 900, every=2.0)
    used1, prefixes1 = redis_usage()
    grown = {k: prefixes1.get(k, 0) - prefixes0.get(k, 0) for k in set(prefixes0) | set(prefixes1)}
    return {
        "parked_runs": len(ids),
        "parked_status_counts": dict(Counter(Run.objects.filter(id__in=ids).values_list("status", flat=True))),
        "redis_used_memory_per_parked_run_bytes": round((used1 - used0) / len(ids), 1),
        "redis_keys_grown_bytes": {k: v for k, v in sorted(grown.items()) if v},
        "redis_used_memory_before_after": [used0, used1],
        "runs_tables_bytes_per_parked_run": round((cap.runs_tables_bytes() - tables0) / len(ids)),
        "awaiting_input": RunStatus.AWAITING_INPUT.value,
    }


def main() -> None:
    cap.DATA.mkdir(parents=True, exist_ok=True)
    up = Up(None)
    try:
        up.start()
        pids = kinds(up)
        figures: dict[str, Any] = {
            "idle_rss_mib_by_kind": per_kind(rss_mib(pids), pids),
            "idle_pg_connections_by_kind": per_kind({k: float(v) for k, v in connections_by_pid().items()}, pids),
        }
        figures |= incall(up, pids)
        figures["after_incall_rss_mib_by_kind"] = per_kind(rss_mib(pids), pids)
        figures |= parked()
        cap.publish("sizing", figures)
    finally:
        up.stop()
        cap.connection.close()
        cap.SERVICES.stop()


if __name__ == "__main__":
    main()
