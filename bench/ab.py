#!/usr/bin/env python
"""A/B of worker configurations on the engine phase of bench/loop.py.

The host's speed drifts by up to 30 % between runs, so single runs cannot
compare two settings. This starts fresh workers for each configuration in
turn, alternating them for BENCH_AB_ROUNDS rounds (3), runs the engine phase
(200 runs x 10 iterations, after a warm-up) and prints each round and the
medians. A null A/B (the same configuration twice) differed by ~2 % in the
medians of 3 rounds, and by up to 10 % in single rounds.

    BENCH_AB="default:2:600;fewer:4:300;knob:2:600:LOOMCYCLE_X=1" .venv/bin/python bench/ab.py

Each configuration is name:worker_processes:threads[:ENV=value,ENV=value],
the environment applying to its workers only. `BENCH_CODE=<checkout>` among
them runs that configuration's workers on another checkout's code (the same
database schema), so one spell compares two versions of the engine:

    BENCH_AB="before:2:600:BENCH_CODE=/tmp/before;after:2:600" .venv/bin/python bench/ab.py

Besides iterations/s, each configuration's medians of CPU milliseconds per
iteration (workers, Postgres) and commits per iteration are printed. Every
process is stopped.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import loop, stack


def configs(spec: str) -> list[tuple[str, int, int, dict[str, str]]]:
    out = []
    for part in spec.split(";"):
        name, workers, threads, *rest = part.split(":")
        env = dict(item.split("=", 1) for item in rest[0].split(",")) if rest and rest[0] else {}
        out.append((name, int(workers), int(threads), env))
    return out


def main() -> None:
    cfgs = configs(os.environ.get("BENCH_AB", "default:2:600"))
    rounds = int(os.environ.get("BENCH_AB_ROUNDS", "3"))
    loop.call_command("migrate", interactive=False, verbosity=0)
    loop.load_yaml_config()
    results: dict[str, list[float]] = {name: [] for name, *_ in cfgs}
    costs: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in cfgs}
    for rnd in range(rounds):
        for name, workers, threads, extra in cfgs:
            loop.sql(loop.TRUNCATE_RUNS)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
            code = Path(env.pop("BENCH_CODE", stack.ROOT))
            procs = stack.start_workers(
                loop.app,
                argv_app=["-A", "workers.celery:app"],
                queues="runs,maintenance",
                env=env,
                tag=f"ab{rnd}{name}-",
                count=workers,
                concurrency=threads,
                logdir=loop.DATA,
                cwd=code,
            )
            try:
                r = loop.engine_phase(procs)
            finally:
                stack.stop_all(procs)
            results[name].append(r["iterations_per_s"])
            costs[name].append({k: v for k, v in r.items() if k.startswith("cpu_ms_") or k.startswith("commits")})
            print(
                f"round {rnd} {name}: {r['iterations_per_s']:.0f} iterations/s, overhead p50 "
                f"{r['p50_overhead_ms']:.1f} ms p99 {r['p99_overhead_ms']:.1f} ms; admission wait p50 "
                f"{r['p50_admission_ms']:.1f} ms p99 {r['p99_admission_ms']:.1f} ms",
                flush=True,
            )
    for name, values in results.items():
        print(f"{name}: median {statistics.median(values):.0f} iterations/s {[round(v) for v in values]}")
        medians = {k: statistics.median(c[k] for c in costs[name]) for k in costs[name][0]}
        print(f"{name}: median per iteration " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    try:
        main()
    finally:
        loop.connection.close()
        loop.SERVICES.stop()
