#!/usr/bin/env python
"""The spend gate's own cost per iteration (issue 37, docs/performance.md "Budgets"), measured in
one process against the real embedded Postgres: the engine's `apps.runs.engine.budget.gate` on a
claimed run, called BENCH_GATE_CALLS times per round, each after a ledger row of the run's step (so
every gate settles spend, as an iteration's does), interleaved with as many `SELECT 1` round trips.

Per scenario ("none": no limit configured; "three": an operator soft limit, a tenant hard limit and
an agent cost limit in scope, bench/budgets.py's) it prints the statements per gate (Django's
CaptureQueriesContext), this process's CPU microseconds per gate (time.process_time: what the
worker spends, little moved by other processes' load) and the gate's wall time as a multiple of
one `SELECT 1` round trip measured in the same round (the ratio cancels most of a loaded host's
drift). Medians over BENCH_GATE_ROUNDS rounds. Run it on two checkouts (BENCH_GATE_DATA shared)
to compare builds: the script uses only the engine's gate and the run store's claim.

    .venv/bin/python bench/budget_gate.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import stack

DATA = Path(os.environ.get("BENCH_GATE_DATA", str(stack.ROOT / ".loomcycle" / "bench-gate")))
SERVICES = stack.boot(DATA, stack.BENCH / "agents.yaml")

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.budgets import services as budgets  # noqa: E402
from apps.budgets.models import TokenLimit  # noqa: E402
from apps.core.types import Principal  # noqa: E402
from apps.gateway.models import UsageEntry, UsageSource  # noqa: E402
from apps.runs import services, store  # noqa: E402
from apps.runs.engine import budget  # noqa: E402
from apps.runs.engine.write import Next, StepWrite  # noqa: E402
from apps.runs.models import Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from apps.runs.store import ClaimedRun  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402

CALLS = int(os.environ.get("BENCH_GATE_CALLS", "300"))
ROUNDS = int(os.environ.get("BENCH_GATE_ROUNDS", "5"))
BIG = Decimal(10**12)
PRINCIPAL = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))


def limits(scenario: str) -> None:
    TokenLimit.objects.all().delete()
    if scenario == "three":
        for spec in (
            budgets.LimitSpec(tenant_id="", scope="operator", soft_limit=BIG),
            budgets.LimitSpec(tenant_id="", scope="tenant", hard_limit=BIG),
            budgets.LimitSpec(tenant_id="", scope="agent", scope_id="loop10", kind="cost_usd", hard_limit=BIG),
        ):
            budgets.limit_put(spec=spec, updated_by="bench")


def claimed() -> ClaimedRun:
    data = services.RunCreate(agent="loop10", segments=[Segment(text="gate")], user_id="bench-gate")
    run = services.run_create(principal=PRINCIPAL, data=data)
    c = store.claim(run_id=run.id, step=run.step, owner="bench-gate", lease_seconds=3600)
    assert c is not None, "no worker may run: the run must stay ours"
    UsageEntry.objects.create(
        created_at=timezone.now(), run_id=c.id, step=c.step, source=UsageSource.RUN, provider="mock", model="m",
        input_tokens=7, output_tokens=3,
    )  # fmt: skip
    return c


def gates(run: ClaimedRun) -> tuple[float, float]:
    """(CPU s, wall s) of CALLS gates."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(CALLS):
        assert budget.gate(run, StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE)) is None
    return time.process_time() - cpu, time.perf_counter() - wall


def round_trips() -> float:
    wall = time.perf_counter()
    with connection.cursor() as cur:
        for _ in range(CALLS):
            cur.execute("SELECT 1")
            cur.fetchone()
    return time.perf_counter() - wall


def scenario(name: str) -> dict[str, float]:
    limits(name)
    run = claimed()
    budget.gate(run, StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE))  # warm: windows, caches
    with CaptureQueriesContext(connection) as q:
        budget.gate(run, StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE))
    cpu_us, ratio = [], []
    for _ in range(ROUNDS):
        base_a = round_trips()
        cpu, wall = gates(run)
        base_b = round_trips()
        cpu_us.append(cpu / CALLS * 1e6)
        ratio.append(wall / ((base_a + base_b) / 2))
    return {"statements": len(q), "cpu_us": statistics.median(cpu_us), "x_select1": statistics.median(ratio)}


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    Run.objects.filter(lease_owner="bench-gate").update(status=RunStatus.COMPLETED, lease_until=None)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f}; {CALLS} gates x {ROUNDS} rounds per scenario")
    try:
        for name in ("none", "three"):
            r = scenario(name)
            print(
                f"{name:>5}: {r['statements']} statements per gate, {r['cpu_us']:.0f} us CPU per gate, "
                f"wall {r['x_select1']:.2f} x one SELECT 1 round trip"
            )
    finally:
        Run.objects.filter(lease_owner="bench-gate").update(status=RunStatus.COMPLETED, lease_until=None)
        TokenLimit.objects.all().delete()


if __name__ == "__main__":
    main()
