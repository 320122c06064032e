#!/usr/bin/env python
"""Infrastructure restarts (issue 25): the embedded Redis restarted with its data lost, then the
embedded Postgres restarted, each while a mixed workload is mid-flight (tests/chaos/infra_workload.py:
tool-calling runs with model latency, parents parked on a child, channel waiters, interactive runs,
Interruption asks, an SSE follower). After each fault the parked runs are answered through the API
and the engine's contract is checked through SQL.

A stack of its own under .loomcycle/infra (embedded Postgres and Redis, INFRA_WORKERS workers of 16
threads, beat, one Daphne), at the runtime's default timings (lease, sweep, grace) unless the
environment sets them. Figures per fault: recovery, from the restart's end to each run that was
queued or inside an iteration committing its next event, and from the answer to each parked run's
next event (p50/p100); violations (must be 0). Every wait is bounded; every process is stopped,
also on failure or Ctrl-C. Knobs: INFRA_RUNS (tool runs per phase, 24), INFRA_EACH (runs of each
parked kind, 4), INFRA_PG_DOWN_S (seconds Postgres stays down, 3), INFRA_WORKERS (2).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "infra"
RUNS = int(os.environ.get("INFRA_RUNS", "24"))
EACH = int(os.environ.get("INFRA_EACH", "4"))
PG_DOWN_S = float(os.environ.get("INFRA_PG_DOWN_S", "3"))
WORKERS = int(os.environ.get("INFRA_WORKERS", "2"))

from bench.stack import host_steal_pct  # noqa: E402
from tests.chaos import infra_workload as wl  # noqa: E402
from tests.chaos.infra import InfraStack, infra_stack  # noqa: E402


def db_now(stack: InfraStack) -> Any:
    return stack.sql("SELECT now()")[0][0]


def phase(stack: InfraStack, http: httpx.Client, fault: str) -> dict[str, Any]:
    w = wl.workload_start(http, stack, tag=fault, tool_runs=RUNS, steps=4, each=EACH)
    wl.wait_parked(stack, w, timeout=120)
    in_flight = [
        r
        for (r,) in stack.sql(
            "SELECT id FROM runs_run WHERE id = ANY(%s) AND status IN ('queued', 'running')", (w.tool_runs,)
        )
    ]
    cpu0, t0 = psutil.cpu_times(), time.monotonic()
    if fault == "redis":
        stack.restart_redis(lose_data=True)
    else:
        stack.restart_postgres(down_s=PG_DOWN_S)
    restarted = db_now(stack)
    fault_s = time.monotonic() - t0
    running = wl.next_event_delays(stack, in_flight, restarted, timeout=300)
    answered = db_now(stack)
    wl.unpark(http, stack, w)
    parked = wl.next_event_delays(stack, [*w.waiters, *w.chats, *w.askers], answered, timeout=300)
    wl.finish(http, stack, w, timeout=300)
    violations = wl.contract_violations(stack, w, fault)
    return {
        "fault": fault,
        "runs": len(w.everything()) + len(w.parents),
        "fault_s": fault_s,
        "running": running,
        "parked": parked,
        "resumes": sum(f.resumes for f in w.followers),
        "violations": violations,
        "steal": host_steal_pct(cpu0, psutil.cpu_times()),
        "load": os.getloadavg()[0],
    }


def report(r: dict[str, Any]) -> None:
    def p(values: list[float]) -> str:
        return f"p50 {statistics.median(values):.2f} s, p100 {max(values):.2f} s over {len(values)}" if values else "-"

    print(
        f"{r['fault']}: {r['runs']} runs (with children), restart took {r['fault_s']:.2f} s; "
        f"in-flight runs progressing again {p(r['running'])}; parked runs after their answer {p(r['parked'])}; "
        f"SSE resumes {r['resumes']}; violations {len(r['violations'])}; load {r['load']:.2f}, "
        f"steal {r['steal']:.1f} %",
        flush=True,
    )
    for v in r["violations"]:
        print(f"  VIOLATION: {v}", flush=True)


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    print(f"infra_restarts: {RUNS} tool runs + {EACH} of each parked kind per fault, {WORKERS} workers", flush=True)
    failed = 0
    template = ROOT / ".loomcycle" / "infra-template"
    with infra_stack(DATA, workers=WORKERS, template_root=template) as stack:
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:
            for fault in ("redis", "postgres"):
                result = phase(stack, http, fault)
                report(result)
                failed += len(result["violations"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
