#!/usr/bin/env python
"""Engine benchmark (`make bench`): starts the embedded stack and prints, in one run,

1. engine throughput: N concurrent runs x K iterations on the zero-latency mock;
   runs/s, iterations/s, p50/p99 engine overhead per iteration (iteration wall
   time minus provider time, sampled by the workers) and write commits per
   iteration (Postgres transaction ids consumed, minus one per run creation);
   then the same overhead at light load (4 runs at a time), without queueing;
2. the floor, measured on the same machine in the same run: a bare Celery hop
   doing one Postgres INSERT+COMMIT of ~4 KB (bench/floor_app.py), with the
   same broker, settings and worker pool, and our ratio to it;
3. in-flight capacity: R runs each inside a 2 s mock provider call at once,
   with the peak number of leased runs and total worker RSS;
4. parked capacity: P interactive runs parked at awaiting_input, with the worker
   count and RSS before and after.

Knobs (env): BENCH_RUNS (200), BENCH_ITERS (10: fixed by bench/agents.yaml),
BENCH_INFLIGHT (1000), BENCH_PARKED (1000), BENCH_WORKERS (2),
BENCH_CONCURRENCY (600). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench"
TIMINGS_KEY = "lc:bench:timings"
RUNS = int(os.environ.get("BENCH_RUNS", "200"))
ITERS = 10
INFLIGHT = int(os.environ.get("BENCH_INFLIGHT", "1000"))
PARKED = int(os.environ.get("BENCH_PARKED", "1000"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "600"))

from bench import stack  # noqa: E402

SERVICES = stack.boot(
    DATA,
    stack.BENCH / "agents.yaml",
    LOOMCYCLE_ENGINE_TIMINGS_KEY=TIMINGS_KEY,
)
import django.db.models  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from apps.core.types import Principal  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.models import Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from bench import stack  # noqa: E402
from bench.stack import cpu_s, host_steal_pct, pct, rss_mib, stop_all  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

TRUNCATE_RUNS = "TRUNCATE runs_run, runs_runevent, runs_transcriptentry, runs_runinput, runs_toolcallrecord CASCADE"
PRINCIPAL = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))


def sql(query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


def start_workers(argv_app: list[str], queues: str, env: dict[str, str], tag: str) -> list[subprocess.Popen[bytes]]:
    return stack.start_workers(
        app,
        argv_app=argv_app,
        queues=queues,
        env=env,
        tag=tag,
        count=WORKERS,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )


def create_runs(agent: str, n: int) -> list[str]:
    def one(_: int) -> str:
        try:
            data = services.RunCreate(agent=agent, segments=[Segment(text="bench")])
            return services.run_create(principal=PRINCIPAL, data=data).id
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def wait_status(ids: list[str], status: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Run.objects.filter(id__in=ids, status=status).count() == len(ids):
            return time.monotonic()
        time.sleep(0.05)
    counts = dict(Run.objects.filter(id__in=ids).values_list("status").annotate(n=django.db.models.Count("id")))
    raise SystemExit(f"runs did not reach {status} within {timeout} s: {counts}")


def engine_phase(workers: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    wait_status(create_runs("loop10", 20), RunStatus.COMPLETED, 120)  # warm-up: pools, threads, caches
    client = sync_client()
    stack.timing_samples(client, TIMINGS_KEY)  # lets the warm-up's buffered samples land before they are dropped
    client.delete(TIMINGS_KEY)
    xid0 = int(sql("SELECT pg_current_xact_id()::text::bigint")[0][0])  # type: ignore[call-overload]
    groups = {"worker": [p.pid for p in workers], "driver": [os.getpid()]}
    cpu0, services0 = {k: cpu_s(v) for k, v in groups.items()}, stack.service_cpu()
    host0 = psutil.cpu_times()
    t0 = time.monotonic()
    ids = create_runs("loop10", RUNS)
    t1 = wait_status(ids, RunStatus.COMPLETED, 600)
    cpu1 = {k: cpu_s(v) for k, v in groups.items()}
    services = stack.service_cpu_delta(services0)  # postgres backends that exited are not counted
    steal = host_steal_pct(host0, psutil.cpu_times())
    xid1 = int(sql("SELECT pg_current_xact_id()::text::bigint")[0][0])  # type: ignore[call-overload]
    elapsed = t1 - t0
    iterations = sum(Run.objects.filter(id__in=ids).values_list("step", flat=True))
    samples = stack.timing_samples(client, TIMINGS_KEY)
    overhead = [total - provider for total, provider, _ in samples]
    admission = [wait for _, _, wait in samples]
    # xids: one per write transaction; minus the run creations and the 2 probes themselves
    commits = (xid1 - xid0 - RUNS - 1) / iterations
    cpu = {k: (cpu1.get(k, 0.0) - cpu0[k]) * 1000 / iterations for k in cpu0}
    cpu |= {k: v * 1000 / iterations for k, v in services.items()}
    print(
        "cpu ms/iteration: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()) + f"; host steal {steal:.0f} %",
        flush=True,
    )
    return {
        "runs_per_s": RUNS / elapsed,
        "iterations_per_s": iterations / elapsed,
        "iterations": iterations,
        "elapsed_s": elapsed,
        "p50_overhead_ms": pct(overhead, 0.5),
        "p99_overhead_ms": pct(overhead, 0.99),
        "p50_admission_ms": pct(admission, 0.5),
        "p99_admission_ms": pct(admission, 0.99),
        "samples": len(samples),
        "commits_per_iteration": commits,
        **{f"cpu_ms_{k}": v for k, v in cpu.items()},  # per iteration, by process group
    }


def light_load_phase(concurrent: int, rounds: int) -> dict[str, float]:
    """Overhead without saturation: `concurrent` runs at a time, `rounds` times.

    One run at a time is the engine's own latency: its round trips and CPU with
    the machine otherwise idle. Four at a time already keep about two thirds of
    the two cores busy (Postgres and the workers' consumer threads included).
    """
    client = sync_client()
    stack.timing_samples(client, TIMINGS_KEY)  # lets earlier buffered samples land before they are dropped
    client.delete(TIMINGS_KEY)
    for _ in range(rounds):
        wait_status(create_runs("loop10", concurrent), RunStatus.COMPLETED, 120)
    samples = stack.timing_samples(client, TIMINGS_KEY)
    overhead = [total - provider for total, provider, _ in samples]
    return {
        f"light{concurrent}_p50_overhead_ms": pct(overhead, 0.5),
        f"light{concurrent}_p99_overhead_ms": pct(overhead, 0.99),
        f"light{concurrent}_samples": len(samples),
    }


def floor_phase(env: dict[str, str]) -> dict[str, float]:
    sql("DROP TABLE IF EXISTS floor_ckpt")
    sql(
        "CREATE TABLE floor_ckpt (id bigserial PRIMARY KEY, run text, chain int, step int, payload jsonb, "
        "created_at timestamptz DEFAULT now())"
    )
    pg = os.environ["DATABASE_URL"]
    broker = os.environ["REDIS_URL"]
    fenv = {
        **env,
        "FLOOR_PG": pg,
        "FLOOR_REDIS": broker.replace("redis+socket://", "unix://"),
        "PYTHONPATH": str(ROOT / "bench"),
    }
    procs = start_workers(["-A", "floor_app:app"], "floor", fenv, "floor")
    try:
        from celery import Celery

        floor = Celery("floor")
        floor.config_from_object("loomcycle_project.celeryconfig")  # the engine's broker and transport
        client = sync_client()

        def chains(n: int, hops: int) -> float:
            run = uuid.uuid4().hex[:8]
            t0 = time.monotonic()
            for c in range(n):
                floor.send_task("floor.hop", args=(run, c, 0, hops), queue="floor")
            deadline = t0 + 300
            while client.llen(f"floor:done:{run}") < n:
                if time.monotonic() > deadline:
                    raise SystemExit("floor chains did not finish in 300 s")
                time.sleep(0.005)
            return time.monotonic() - t0

        chains(20, 10)  # warm-up: the pools' connections (and their backends) exist from here on
        workers0, services0, host0 = cpu_s([p.pid for p in procs]), stack.service_cpu(), psutil.cpu_times()
        elapsed = chains(RUNS, ITERS)
        cpu = {"worker": cpu_s([p.pid for p in procs]) - workers0, **stack.service_cpu_delta(services0)}
        cpu = {k: v * 1000 / (RUNS * ITERS) for k, v in cpu.items()}
        print("floor cpu ms/hop: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()), flush=True)
        return {
            "floor_iterations_per_s": RUNS * ITERS / elapsed,
            "floor_elapsed_s": elapsed,
            "floor_steal_pct": host_steal_pct(host0, psutil.cpu_times()),
            "floor_cpu_ms": sum(cpu.values()),
            **{f"floor_cpu_ms_{k}": v for k, v in cpu.items()},
        }
    finally:
        stop_all(procs)
        sql("DROP TABLE IF EXISTS floor_ckpt")


_INFLIGHT_COUNTS = (
    "SELECT count(*) FILTER (WHERE status = 'running' AND lease_owner <> ''), "
    "count(*) FILTER (WHERE status = 'completed') FROM runs_run WHERE agent_name = 'inflight'"
)


def inflight_phase(workers: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    replies = app.control.cancel_consumer(
        "runs", reply=True, timeout=5, limit=WORKERS
    )  # queue doorbells, release them at once
    if os.environ.get("BENCH_DEBUG"):
        print("cancel_consumer:", replies, flush=True)
    ids = create_runs("inflight", INFLIGHT)
    rss0 = rss_mib(workers)
    t0 = time.monotonic()
    app.control.add_consumer("runs", reply=True, timeout=5, limit=WORKERS)
    peak, peak_rss = 0, rss0
    deadline = t0 + 120
    while time.monotonic() < deadline:
        # One cheap statement per poll: the poll shares the two cores with what it measures.
        leased, completed = sql(_INFLIGHT_COUNTS)[0]
        peak, peak_rss = max(peak, int(leased)), max(peak_rss, rss_mib(workers))  # type: ignore[call-overload]
        if os.environ.get("BENCH_DEBUG"):
            counts = dict(Run.objects.filter(id__in=ids).values_list("status").annotate(n=django.db.models.Count("id")))
            print(f"  t={time.monotonic() - t0:.2f} leased={leased} {counts}", flush=True)
        if completed == len(ids):
            break
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    done = Run.objects.filter(id__in=ids, status=RunStatus.COMPLETED).count()
    return {
        "inflight_runs": peak,
        "inflight_completed": done,
        "inflight_elapsed_s": elapsed,
        "inflight_worker_rss_mib": peak_rss,
        "rss_before_inflight_mib": rss0,
    }


def parked_phase(workers: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    procs0, rss0 = sum(p.poll() is None for p in workers), rss_mib(workers)
    ids = create_runs("parked", PARKED)
    wait_status(ids, RunStatus.AWAITING_INPUT, 300)
    time.sleep(1.0)
    leased = Run.objects.filter(id__in=ids).exclude(lease_owner="").count()
    return {
        "parked_runs": len(ids),
        "parked_leased": leased,
        "parked_worker_procs_before": procs0,
        "parked_worker_procs": sum(p.poll() is None for p in workers),
        "parked_rss_before_mib": rss0,
        "parked_worker_rss_mib": rss_mib(workers),
    }


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    sql(TRUNCATE_RUNS)
    sync_client().delete("runs", "floor")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    print(
        f"loomcycle bench: {os.cpu_count()} cores, {WORKERS} worker processes x {CONCURRENCY} threads; "
        f"{RUNS} runs x {ITERS} iterations; {INFLIGHT} in flight; {PARKED} parked",
        flush=True,
    )
    workers = start_workers(["-A", "workers.celery:app"], "runs,maintenance", env, "bench")
    try:
        r = engine_phase(workers)
        print(
            f"engine   {r['runs_per_s']:.1f} runs/s, {r['iterations_per_s']:.0f} iterations/s "
            f"({r['iterations']} iterations in {r['elapsed_s']:.2f} s); overhead/iteration p50 "
            f"{r['p50_overhead_ms']:.2f} ms, p99 {r['p99_overhead_ms']:.2f} ms ({r['samples']} samples); "
            f"queued for admission before the claim p50 {r['p50_admission_ms']:.1f} ms, "
            f"p99 {r['p99_admission_ms']:.1f} ms; {r['commits_per_iteration']:.2f} write commits/iteration",
            flush=True,
        )
        for concurrent, rounds in ((1, 50), (4, 10)):
            r |= light_load_phase(concurrent, rounds)
            key = f"light{concurrent}"
            print(
                f"light    {concurrent} run{'s' if concurrent > 1 else ''} at a time: overhead/iteration p50 "
                f"{r[f'{key}_p50_overhead_ms']:.2f} ms, p99 {r[f'{key}_p99_overhead_ms']:.2f} ms "
                f"({r[f'{key}_samples']} samples)",
                flush=True,
            )
        r |= inflight_phase(workers)
        print(
            f"inflight peak {r['inflight_runs']} runs leased at once; {r['inflight_completed']}/{INFLIGHT} done "
            f"in {r['inflight_elapsed_s']:.2f} s (each is a 2 s provider call); worker RSS "
            f"{r['rss_before_inflight_mib']:.0f} -> {r['inflight_worker_rss_mib']:.0f} MiB",
            flush=True,
        )
        r |= parked_phase(workers)
        print(
            f"parked   {r['parked_runs']} runs at awaiting_input, {r['parked_leased']} leased; worker processes "
            f"{r['parked_worker_procs_before']} -> {r['parked_worker_procs']}; RSS "
            f"{r['parked_rss_before_mib']:.0f} -> {r['parked_worker_rss_mib']:.0f} MiB",
            flush=True,
        )
    finally:
        stop_all(workers)
    r |= floor_phase(env)
    ratio = r["iterations_per_s"] / r["floor_iterations_per_s"]
    engine_cpu = sum(r[f"cpu_ms_{k}"] for k in ("worker", "postgres", "redis"))
    print(
        f"floor    {r['floor_iterations_per_s']:.0f} hops/s (Celery hop + one INSERT/COMMIT, same pool; host steal "
        f"{r['floor_steal_pct']:.0f} %); engine/floor = {ratio:.2f}; CPU ms (workers + Postgres + Redis) engine "
        f"{engine_cpu:.2f} per iteration, floor {r['floor_cpu_ms']:.2f} per hop "
        f"({engine_cpu / r['floor_cpu_ms']:.2f}x)",
        flush=True,
    )
    print(
        " ".join(
            [
                f"iterations_per_s={r['iterations_per_s']:.1f}",
                f"floor_iterations_per_s={r['floor_iterations_per_s']:.1f}",
                f"floor_ratio={ratio:.3f}",
                f"cpu_ms_per_iteration={engine_cpu:.2f}",
                f"floor_cpu_ms_per_hop={r['floor_cpu_ms']:.2f}",
                f"p99_overhead_ms={r['p99_overhead_ms']:.2f}",
                f"commits_per_iteration={r['commits_per_iteration']:.2f}",
                f"inflight_runs={r['inflight_runs']}",
                f"inflight_worker_rss_mib={r['inflight_worker_rss_mib']:.0f}",
                f"parked_runs={r['parked_runs']}",
                f"parked_worker_rss_mib={r['parked_worker_rss_mib']:.0f}",
            ]
        )
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        connection.close()
        SERVICES.stop()
