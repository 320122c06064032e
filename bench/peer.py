#!/usr/bin/env python
"""The engine, its floor and LangGraph in one spell (`make bench-peer`).

Alternates, for BENCH_PEER_ROUNDS rounds (2), on the same embedded Postgres and Redis
(under .loomcycle/bench, as bench/loop.py):

1. the engine phase of bench/loop.py: BENCH_RUNS (200) concurrent runs x 10 iterations on the
   zero-latency mock, BENCH_WORKERS (2) worker processes x BENCH_CONCURRENCY (600) threads;
2. the floor phase of bench/loop.py (a bare Celery hop + one INSERT/COMMIT of ~4 KB);
3. LangGraph + AsyncPostgresSaver (bench/langgraph_loop.py, in .venv-peer): the same workload
   (runs of 10 model calls, 9 of them calling one tool) in BENCH_PEER_PROCESSES (2) processes,
   each BENCH_RUNS / processes runs at once, durability BENCH_PEER_DURABILITY (async,
   LangGraph's default).

Each phase prints iterations/s, write commits per iteration (Postgres transaction ids
consumed), CPU ms per iteration (its Python processes, this bench's Postgres and Redis) and the
host's steal; each round prints the ratios engine/floor and engine/LangGraph of that round,
and the end their medians, of throughput and of CPU per iteration (the steadier figure on a
loaded host: the kernel shares a core per thread, and the engine and the floor run more
threads than LangGraph's single event loop per process). Every process is stopped.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import loop, stack

PEER_PYTHON = stack.ROOT / ".venv-peer" / "bin" / "python"
ROUNDS = int(os.environ.get("BENCH_PEER_ROUNDS", "2"))
PROCESSES = int(os.environ.get("BENCH_PEER_PROCESSES", "2"))
DURABILITY = os.environ.get("BENCH_PEER_DURABILITY", "async")


def xid() -> int:
    return int(loop.sql("SELECT pg_current_xact_id()::text::bigint")[0][0])  # type: ignore[call-overload]


def langgraph_phase() -> dict[str, float]:
    """PROCESSES peer processes started together; figures over the span from the first one's
    start to the last one's end (each has warmed up before the common start)."""
    loop.sql("DROP TABLE IF EXISTS checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations")
    argv = [str(PEER_PYTHON), str(stack.BENCH / "langgraph_loop.py"), "--dsn", os.environ["DATABASE_URL"]]
    subprocess.run([*argv, "--setup"], check=True, timeout=120)
    start_at = time.time() + 10.0  # time for every process to import, connect and warm up
    per = loop.RUNS // PROCESSES
    argv += ["--runs", str(per), "--concurrent", str(per), "--iters", str(loop.ITERS), "--durability", DURABILITY]
    argv += ["--start-at", str(start_at)]
    # Each in its own session, as the engine's workers (stack.spawn): with the kernel's autogroup
    # scheduling a session is one CPU share on a loaded host, so sharing the driver's would starve them.
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "start_new_session": True}
    procs = [subprocess.Popen(argv, **pipes) for _ in range(PROCESSES)]  # type: ignore[call-overload]
    try:
        while time.time() < start_at - 0.3:
            time.sleep(0.05)
        services0, host0, xid0 = stack.service_cpu(), psutil.cpu_times(), xid()
        lines = [_peer_line(p) for p in procs]
        services = stack.service_cpu_delta(services0)  # the pools' backends are still open
        steal, xid1 = stack.host_steal_pct(host0, psutil.cpu_times()), xid()
        for p in procs:
            p.communicate("\n", timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    iterations = sum(line["iterations"] for line in lines)
    elapsed = max(line["t1"] for line in lines) - min(line["t0"] for line in lines)
    cpu = {"python": sum(line["cpu_s"] for line in lines) * 1000 / iterations}
    cpu |= {k: v * 1000 / iterations for k, v in services.items()}
    return {
        "peer_iterations_per_s": iterations / elapsed,
        "peer_commits_per_iteration": (xid1 - xid0 - 1) / iterations,
        "peer_steal_pct": steal,
        **{f"peer_cpu_ms_{k}": v for k, v in cpu.items()},
    }


def _peer_line(proc: subprocess.Popen[str]) -> dict[str, float]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("PEER_JSON "):
            return dict(json.loads(line.split(" ", 1)[1]))
    raise SystemExit(f"a LangGraph process ended without its figures (exit {proc.wait()})")


def engine_and_floor() -> dict[str, float]:
    loop.sql(loop.TRUNCATE_RUNS)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = loop.start_workers(["-A", "workers.celery:app"], "runs,maintenance", env, "peer")
    try:
        r = loop.engine_phase(workers)
    finally:
        stack.stop_all(workers)
    return r | loop.floor_phase(env)


ENGINE_CPU = ("cpu_ms_", ("worker", "postgres", "redis"))
FLOOR_CPU = ("floor_cpu_ms_", ("worker", "postgres", "redis"))
PEER_CPU = ("peer_cpu_ms_", ("python", "postgres", "redis"))


def cpu_total(r: dict[str, float], group: tuple[str, tuple[str, ...]]) -> float:
    prefix, parts = group
    return sum(r[f"{prefix}{k}"] for k in parts)


def cpu_line(r: dict[str, float], group: tuple[str, tuple[str, ...]]) -> str:
    """CPU ms per iteration of the process groups that do the work (not the bench's driver)."""
    prefix, parts = group
    detail = ", ".join(f"{k} {r[prefix + k]:.2f}" for k in parts)
    return f"{cpu_total(r, group):.2f} ms ({detail})"


def one_round(rnd: int) -> dict[str, float]:
    r = engine_and_floor() | langgraph_phase()
    floor = r["floor_iterations_per_s"]
    print(
        f"round {rnd}: engine {r['iterations_per_s']:.0f} iterations/s, {r['commits_per_iteration']:.2f} commits, "
        f"CPU {cpu_line(r, ENGINE_CPU)} per iteration\n"
        f"  floor {floor:.0f} hops/s, CPU {cpu_line(r, FLOOR_CPU)} per hop (steal {r['floor_steal_pct']:.0f} %)\n"
        f"  langgraph {r['peer_iterations_per_s']:.0f} iterations/s, {r['peer_commits_per_iteration']:.2f} commits, "
        f"CPU {cpu_line(r, PEER_CPU)} per iteration (steal {r['peer_steal_pct']:.0f} %)\n"
        f"  throughput: engine/floor {r['iterations_per_s'] / floor:.2f}, "
        f"engine/langgraph {r['iterations_per_s'] / r['peer_iterations_per_s']:.2f}; CPU per iteration: "
        f"engine/floor {cpu_total(r, ENGINE_CPU) / cpu_total(r, FLOOR_CPU):.2f}, "
        f"langgraph/engine {cpu_total(r, PEER_CPU) / cpu_total(r, ENGINE_CPU):.2f}",
        flush=True,
    )
    return r


def main() -> None:
    if not PEER_PYTHON.exists():
        raise SystemExit("no .venv-peer: `make bench-peer` creates it from requirements/bench-peer.txt")
    loop.call_command("migrate", interactive=False, verbosity=0)
    loop.load_yaml_config()
    print(
        f"bench-peer: {os.cpu_count()} cores; {loop.RUNS} runs x {loop.ITERS} iterations; engine {loop.WORKERS} "
        f"processes x {loop.CONCURRENCY} threads; LangGraph {PROCESSES} processes, durability {DURABILITY}",
        flush=True,
    )
    rounds = [one_round(rnd) for rnd in range(ROUNDS)]
    for key, label in (("floor_iterations_per_s", "engine/floor"), ("peer_iterations_per_s", "engine/langgraph")):
        ratios = [r["iterations_per_s"] / r[key] for r in rounds]
        print(f"throughput {label}: median {statistics.median(ratios):.2f} {[round(x, 2) for x in ratios]}")
    for a, b, label in ((ENGINE_CPU, FLOOR_CPU, "engine/floor"), (PEER_CPU, ENGINE_CPU, "langgraph/engine")):
        ratios = [cpu_total(r, a) / cpu_total(r, b) for r in rounds]
        print(f"CPU per iteration {label}: median {statistics.median(ratios):.2f} {[round(x, 2) for x in ratios]}")


if __name__ == "__main__":
    try:
        main()
    finally:
        loop.connection.close()
        loop.SERVICES.stop()
