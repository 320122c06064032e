#!/usr/bin/env python
"""Schedule fire lag (`make bench-schedules`): N ScheduleDefs due in the same
minute, fired by the production path (beat sends the tick every
BENCH_SCHED_TICK seconds, workers run it and the runs it creates); prints the
lag from each slot's due time to its run row (the run's created_at, stamped in
the fire's transaction just before it commits), p50/p99/max, the time until
the last fire, and the host's CPU steal.

Knobs (env): BENCH_SCHEDULES (1000), BENCH_SCHED_TICK (1.0 s; production
default 30 s, which adds up to a tick period of lag), BENCH_WORKERS (2),
BENCH_CONCURRENCY (16). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench"
N = int(os.environ.get("BENCH_SCHEDULES", "1000"))
TICK = float(os.environ.get("BENCH_SCHED_TICK", "1.0"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
LEAD_S = 20.0  # the slot is at least this far ahead once the definitions are written
CREATE_S = 0.05  # a generous time to write one definition (8 at a time), to place the slot after them
PREFIX = "bench-sched-"

from bench import stack  # noqa: E402

SERVICES = stack.boot(
    DATA,
    stack.BENCH / "agents.yaml",
    LOOMCYCLE_TENANT_MAX_SCHEDULES=str(N),  # BENCH_SCHEDULES definitions in one tenant
    LOOMCYCLE_TENANT_MAX_DEFINITIONS=str(N),
    LOOMCYCLE_SCHEDULER_ENABLED="1",
    LOOMCYCLE_SCHEDULER_TICK_SECONDS=str(TICK),
)
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.runs.models import Run  # noqa: E402
from apps.substrate import services as substrate  # noqa: E402
from apps.substrate.kinds import get_kind  # noqa: E402
from apps.substrate.models import ScheduleDef  # noqa: E402
from apps.triggers.models import ScheduleFire  # noqa: E402
from bench import stack  # noqa: E402
from bench.stack import pct, stop_all  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

KIND = get_kind("schedule")
AUTHOR = substrate.Author(tenant_id="bench", subject="bench")


def retire_old() -> None:
    """Earlier runs' bench schedules stop firing (they are daily)."""
    for def_id in ScheduleDef.objects.filter(name__startswith=PREFIX, retired=False).values_list("id", flat=True):
        substrate.def_retire_auto(KIND, def_id=def_id)


def slot_ahead() -> datetime:
    """The first minute boundary at least LEAD_S (+ time to write N definitions) away."""
    now = datetime.now(UTC) + timedelta(seconds=LEAD_S + N * CREATE_S)
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1)


def create(slot: datetime, tag: str) -> list[str]:
    cron = f"{slot.minute} {slot.hour} * * *"

    def one(i: int) -> str:
        try:
            overlay = {"agent": "scheduled", "schedule": cron, "prompt": "bench"}
            out = substrate.def_create(KIND, AUTHOR, {"name": f"{PREFIX}{tag}-{i}", "overlay": overlay})
            return str(out["def_id"])
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(one, range(N)))
    if datetime.now(UTC) > slot - timedelta(seconds=5):
        raise SystemExit("writing the definitions took too long to place the slot after them; run again")
    return ids


def wait_fired(ids: list[str], slot: datetime, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ScheduleFire.objects.filter(schedule_def_id__in=ids, fire_time=slot).count() >= len(ids):
            return
        time.sleep(0.2)
    raise SystemExit(f"not every schedule fired within {timeout} s; see {DATA}/*.log")


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    retire_old()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="sched",
        count=WORKERS,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )
    beat = stack.start_beat(env, DATA)
    try:
        slot = slot_ahead()  # after the processes are up: the ticks seed each definition as it is written
        print(
            f"loomcycle schedules bench: {os.cpu_count()} cores, {WORKERS} workers x {CONCURRENCY} threads; "
            f"{N} schedules due at {slot:%H:%M} UTC; tick every {TICK} s",
            flush=True,
        )
        ids = create(slot, f"{int(time.time())}")
        wait = (slot - datetime.now(UTC)).total_seconds()
        print(f"waiting {wait:.0f} s for the slot", flush=True)
        host0 = psutil.cpu_times()
        wait_fired(ids, slot, wait + 300)
        steal = stack.host_steal_pct(host0, psutil.cpu_times())
    finally:
        stop_all([beat, *workers])
        retire_old()
    fires = ScheduleFire.objects.filter(schedule_def_id__in=ids, fire_time=slot)
    created = dict(Run.objects.filter(id__in=fires.values("run_id")).values_list("id", "created_at"))
    lags = [(created[f.run_id] - slot).total_seconds() * 1000 for f in fires if f.run_id in created]
    print(
        f"fire lag (due -> run row) p50 {pct(lags, 0.5):.0f} ms, p99 {pct(lags, 0.99):.0f} ms, "
        f"max {max(lags):.0f} ms over {len(lags)} runs ({fires.exclude(outcome='started').count()} fires without a "
        f"run); host steal {steal:.0f} %",
        flush=True,
    )


if __name__ == "__main__":
    main()
