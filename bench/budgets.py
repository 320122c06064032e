#!/usr/bin/env python
"""Budgets benchmark (issue 37, docs/performance.md "Budgets"), on the embedded stack of bench/loop.py:

1. CPU per iteration with budgets off (no limit in scope) against on (three limits in scope
   of every run: an operator soft limit, a tenant hard limit and an agent cost limit, none
   reached), A-B-A-B on the same workers in one spell: the engine phase of bench/loop.py
   (BENCH_RUNS runs x 10 iterations) per round; worker and Postgres CPU ms per iteration.
2. BENCH_DEFERRED (1000) runs deferred at admission by a spent budget that defers: worker
   RSS before and after they park, then the time from the window's reset (its counter
   row replaced by a fresh one, what a new window is) and one `budgets_wake` until every
   one of them has completed.

    .venv/bin/python bench/budgets.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import loop, stack

SERVICES = loop.SERVICES  # importing bench.loop booted the embedded stack and Django: the apps import after it

from apps.budgets import services as budgets  # noqa: E402
from apps.budgets.models import LimitWindow, TokenLimit  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.models import Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_AB_ROUNDS", "2"))
DEFERRED = int(os.environ.get("BENCH_DEFERRED", "1000"))
BIG = Decimal(10**12)


def limits_on() -> None:
    for spec in (
        budgets.LimitSpec(tenant_id="", scope="operator", soft_limit=BIG),
        budgets.LimitSpec(tenant_id="", scope="tenant", hard_limit=BIG),
        budgets.LimitSpec(tenant_id="", scope="agent", scope_id="loop10", kind="cost_usd", hard_limit=BIG),
    ):
        budgets.limit_put(spec=spec, updated_by="bench")


def ab(procs: list[object]) -> None:
    cpu: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for rnd in range(ROUNDS):
        for name in ("off", "on"):
            loop.sql(loop.TRUNCATE_RUNS)
            TokenLimit.objects.all().delete()
            if name == "on":
                limits_on()
            r = loop.engine_phase(procs)  # type: ignore[arg-type]
            cpu[name].append((r["cpu_ms_worker"], r["cpu_ms_postgres"]))
            print(f"round {rnd} budgets {name}: {r['iterations_per_s']:.0f} iterations/s", flush=True)
    for name, values in cpu.items():
        worker = statistics.median(v[0] for v in values)
        pg = statistics.median(v[1] for v in values)
        print(f"budgets {name}: median cpu ms/iteration worker {worker:.2f} postgres {pg:.2f} {values}", flush=True)


def create(n: int, user: str) -> list[str]:
    def one(_: int) -> str:
        try:
            data = services.RunCreate(agent="loop10", segments=[Segment(text="bench")], user_id=user)
            return services.run_create(principal=loop.PRINCIPAL, data=data).id
        finally:
            loop.connection.close()

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def deferred(procs: list[object]) -> None:
    loop.sql(loop.TRUNCATE_RUNS)
    TokenLimit.objects.all().delete()
    spec = budgets.LimitSpec(tenant_id="", scope="user", scope_id="deferred", hard_limit=Decimal(0), on_exceed="defer")
    limit = budgets.limit_put(spec=spec, updated_by="bench")
    rss0 = stack.rss_mib(procs)  # type: ignore[arg-type]
    ids = create(DEFERRED, "deferred")
    loop.wait_status(ids, RunStatus.WAITING_BUDGET, 60)
    time.sleep(2)  # let the workers settle before reading RSS (nothing waits on this: it is a reading)
    rss1 = stack.rss_mib(procs)  # type: ignore[arg-type]
    t0 = time.monotonic()
    TokenLimit.objects.filter(pk=limit.pk).update(hard_limit=Decimal(10**9))  # the new window's budget
    LimitWindow.objects.filter(limit=limit).delete()  # its counter starts over, as at a window's reset
    woken = budgets.budgets_wake()
    t_woken = time.monotonic()
    t_started = _all_claimed(ids)
    t1 = loop.wait_status(ids, RunStatus.COMPLETED, 600)
    print(
        f"deferred {DEFERRED}: worker RSS {rss0:.0f} MiB before, {rss1:.0f} MiB with them parked; "
        f"woken {woken} in {t_woken - t0:.2f} s; every one past its first iteration {t_started - t0:.1f} s "
        f"and all completed {t1 - t0:.1f} s after the reset",
        flush=True,
    )


def _all_claimed(ids: list[str]) -> float:
    """When every run has committed at least one iteration after its wake (bounded wait)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if not Run.objects.filter(id__in=ids, step=0).exists():
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit("deferred runs did not all resume within 600 s")


def main() -> None:
    loop.call_command("migrate", interactive=False, verbosity=0)
    loop.load_yaml_config()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = loop.start_workers(["-A", "workers.celery:app"], "runs,maintenance", env, "budgets")
    try:
        if ROUNDS:
            ab(procs)
        deferred(procs)
    finally:
        stack.stop_all(procs)
        TokenLimit.objects.all().delete()


if __name__ == "__main__":
    try:
        main()
    finally:
        loop.connection.close()
        SERVICES.stop()
