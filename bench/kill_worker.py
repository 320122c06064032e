#!/usr/bin/env python
"""Worker loss under load (issue 16, item 12): N queued runs (BENCH_RUNS, 300)
of 10 zero-latency iterations on 2 workers (BENCH_CONCURRENCY threads each, 64
as `up` starts them) with beat, at the default lease, heartbeat, sweep and
grace; one worker is killed with SIGKILL once a quarter of the iterations have
committed. For each doorbell that worker held at that moment (its hash in
workers/held.py, read just before the kill; on a build without the hash, what
Celery's inspect reports it executing and reserved), the delay from the kill
to the commit of that iteration is measured; the p50 and p100 are printed, split by
whether the run was leased (claimed) or still unclaimed (queued in admission
or not yet started). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench-kill"
RUNS = int(os.environ.get("BENCH_RUNS", "300"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))

from bench import stack  # noqa: E402

SERVICES = stack.boot(DATA, stack.BENCH / "agents.yaml", instant_mock=False)

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from apps.runs.models import Run, RunEvent  # noqa: E402
from bench import stack  # noqa: E402
from bench.loop import TRUNCATE_RUNS, create_runs  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers import held  # noqa: E402
from workers.celery import app  # noqa: E402


def held_by(worker_id: str, node: str) -> list[tuple[str, int]]:
    """The worker's held hash (workers/held.py); without one (a build before it),
    what Celery's inspect reports the node executing and reserved."""
    doorbells = []
    for raw in sync_client().hvals(held.held_key(worker_id)):
        message = json.loads(raw)[0]
        args = json.loads(base64.b64decode(message["body"]))[0]
        doorbells.append((str(args[0]), int(args[1])))
    if doorbells:
        return doorbells
    inspect = app.control.inspect(destination=[node], timeout=5)
    tasks = [*((inspect.active() or {}).get(node) or []), *((inspect.reserved() or {}).get(node) or [])]
    return [(str(t["args"][0]), int(t["args"][1])) for t in tasks if t.get("name") == "runs.iterate"]


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    with connection.cursor() as cur:
        cur.execute(TRUNCATE_RUNS)
    sync_client().delete("runs")
    cfg = settings.LOOMCYCLE
    print(
        f"kill_worker: {RUNS} runs x 10 iterations, 2 workers x {CONCURRENCY} threads; lease {cfg.lease_seconds} s, "
        f"heartbeat {cfg.heartbeat_seconds} s, sweep {cfg.sweep_seconds} s, grace {cfg.requeue_grace_seconds} s",
        flush=True,
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="kill",
        count=2,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )
    beat = stack.start_beat(env, DATA)
    procs = [*workers, beat]
    try:
        measure(workers)
    finally:
        stack.stop_all(procs)


def worker_id_of(pid: int) -> str:
    """A worker's id (`<host>:<pid>:<boot token>`), read from its presence key."""
    pattern = f"{held.PRESENCE_PREFIX}{os.uname().nodename}:{pid}:*"
    keys = [k.decode() for k in sync_client().scan_iter(pattern)]
    if len(keys) != 1:
        raise SystemExit(f"expected one presence key for pid {pid}, found {keys}")
    return keys[0].removeprefix(held.PRESENCE_PREFIX)


def measure(workers: list[object]) -> None:
    ids = create_runs("loop10", RUNS)
    deadline = time.monotonic() + 300
    while RunEvent.objects.filter(run_id__in=ids, type="usage").count() < RUNS * 10 // 4:
        if time.monotonic() > deadline:
            raise SystemExit("a quarter of the iterations did not commit within 300 s")
        time.sleep(0.02)
    victim = workers[0]
    worker_id = worker_id_of(victim.pid)  # type: ignore[attr-defined]
    doorbells = held_by(worker_id, f"kill0@{os.uname().nodename}")
    leased = set(Run.objects.filter(lease_owner=worker_id).values_list("id", flat=True))
    os.killpg(victim.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        killed_at = cur.fetchone()[0]
    print(f"killed {worker_id} holding {len(doorbells)} doorbell(s), {len(leased)} of their runs leased", flush=True)
    delays: dict[bool, list[float]] = {True: [], False: []}
    for run_id, step in doorbells:
        committed = None
        deadline = time.monotonic() + 400
        while committed is None and time.monotonic() < deadline:
            committed = (
                RunEvent.objects.filter(run_id=run_id, step=step).order_by("seq").values_list("created_at", flat=True)
            ).first()
            if committed is None:
                time.sleep(0.2)
        if committed is None:
            raise SystemExit(f"run {run_id} step {step} did not commit within 400 s of the kill")
        if committed > killed_at:
            delays[run_id in leased].append((committed - killed_at).total_seconds())
    for is_leased, values in delays.items():
        if values:
            kind = "leased (claimed)" if is_leased else "unclaimed (admission / not started)"
            print(
                f"{kind}: {len(values)} doorbell(s), resume delay p50 {statistics.median(values):.1f} s, "
                f"p100 {max(values):.1f} s",
                flush=True,
            )
    every = delays[True] + delays[False]
    print(f"all held: {len(every)} resumed after the kill, p100 {max(every, default=0.0):.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        connection.close()
        SERVICES.stop()
