#!/usr/bin/env python
"""Circuit benchmark (`make bench-circuit`): loomcycle's three-agent circuit
(SPEC 7.5; agents in bench/circuit.yaml) on the zero-latency mock, at 10, 100
and 500 concurrent circuits, on the embedded stack.

A circuit cN is three runs started together (researcher, editor, evaluator,
one user_id per 10 circuits, prompt "Your circuit_id is cN. ..."), like
loomcycle's circuit-stress driver. The editor and evaluator park on
`subscribe` until their signal is published (no worker held). Per level it
prints circuits/s and runs/s (wall time from the first run created to the last
run finished), p50/p99 circuit latency (first run created -> last run of the
circuit finished), the peak number of parked runs (sampled every 100 ms), and
a validation: every run completed, the three memory keys of every circuit and
one evaluation of its editor's run exist.

Runs are created through the run service in-process (as bench/loop.py does),
not over HTTP: the figures are the engine's, not one Daphne's admission rate.
Then, if the LangGraph peer venv exists (.venv-peer, `make bench-circuit`
makes it from requirements/bench-peer.txt), the same circuit in LangGraph
(bench/langgraph_circuit.py) runs against the same Postgres and the ratios
are printed. The last line is machine-readable key=value pairs.

Knobs (env): BENCH_CIRCUIT_LEVELS (10,100,500), BENCH_WORKERS (2),
BENCH_CONCURRENCY (64 threads per worker), BENCH_PEER (1; 0 skips LangGraph).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench"
LEVELS = [int(x) for x in os.environ.get("BENCH_CIRCUIT_LEVELS", "10,100,500").split(",") if x.strip()]
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))
PEER = os.environ.get("BENCH_PEER", "1") != "0"
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
CIRCUITS_PER_USER = 10
ROLES = ("researcher", "editor", "evaluator")
TIMINGS_KEY = "lc:bench:circuit-timings"

from bench import stack  # noqa: E402

SERVICES = stack.boot(
    DATA,
    stack.BENCH / "circuit.yaml",
    LOOMCYCLE_ENGINE_TIMINGS_KEY=TIMINGS_KEY,
    LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS="120000",  # as loomcycle's circuit load test runs
)
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Count, Max, Min  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from apps.core.types import Principal  # noqa: E402
from apps.evaluations.models import Evaluation  # noqa: E402
from apps.memory.models import MemoryEntry  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.models import TERMINAL, Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from apps.substrate import channeldefs  # noqa: E402
from bench import stack  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

PRINCIPAL = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))


def _user(n: int) -> str:
    return f"user-{(n - 1) // CIRCUITS_PER_USER + 1:03d}"


def declare(circuits: list[int]) -> None:
    spec = channeldefs.ChannelSpec(scope="global", default_ttl=600, max_messages=1000)
    for n in circuits:
        for name in (f"research-done/c{n}", f"editing-done/c{n}"):
            channeldefs.channeldef_create(tenant_id="", name=name, spec=spec)


def start_circuit(n: int) -> tuple[int, list[str]]:
    try:
        prompt = f"Your circuit_id is c{n}. Question: what changed in the last release of project {n}?"
        ids = []
        for role in ROLES:
            data = services.RunCreate(
                agent=role, segments=[Segment(text=prompt)], user_id=_user(n), agent_id=f"{role}-c{n}"
            )
            ids.append(services.run_create(principal=PRINCIPAL, data=data).id)
        return n, ids
    finally:
        connection.close()


class ParkedSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                parked = Run.objects.filter(status=RunStatus.WAITING_CHANNEL).count()
                self.peak = max(self.peak, parked)
                self.stopping.wait(0.1)
        finally:
            connection.close()


def level(size: int, first: int, groups: dict[str, list[int]]) -> dict[str, float]:
    circuits = list(range(first, first + size))
    declare(circuits)
    stack.timing_samples(sync_client(), TIMINGS_KEY)  # earlier buffered samples land before they are dropped
    sync_client().delete(TIMINGS_KEY)
    groups = {**groups, **stack.service_pids()}  # Postgres backends come and go: re-read them
    cpu0 = {k: stack.cpu_by_pid(v) for k, v in groups.items()}
    sampler = ParkedSampler()
    sampler.start()
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        started = dict(pool.map(start_circuit, circuits))
    admitted = time.monotonic() - t0
    all_ids = [i for ids in started.values() for i in ids]
    deadline = time.monotonic() + 900
    while Run.objects.filter(id__in=all_ids).exclude(status__in=TERMINAL).exists():
        if time.monotonic() > deadline:
            counts = dict(Run.objects.filter(id__in=all_ids).values_list("status").annotate(n=Count("id")))
            raise SystemExit(f"level {size}: runs not finished after 900 s: {counts}")
        time.sleep(0.05)
    sampler.stopping.set()
    sampler.join()
    wall = time.monotonic() - t0
    groups = {**groups, **stack.service_pids()}
    cpu = {}
    for k, pids in groups.items():  # a process born during the level counts from zero; one gone is lost
        after = stack.cpu_by_pid(pids)
        cpu[k] = sum(t - cpu0[k].get(pid, 0.0) for pid, t in after.items()) * 1000 / size
    latencies = []
    for ids in started.values():
        span = Run.objects.filter(id__in=ids).aggregate(a=Min("created_at"), b=Max("completed_at"))
        latencies.append((span["b"] - span["a"]).total_seconds() * 1000)
    completed = Run.objects.filter(id__in=all_ids, status=RunStatus.COMPLETED).count()
    samples = [total for total, _, _ in stack.timing_samples(sync_client(), TIMINGS_KEY)]
    return {
        "iterations_per_s": len(samples) / wall,
        "iteration_p50_ms": stack.pct(samples, 0.5),
        "iteration_p99_ms": stack.pct(samples, 0.99),
        "circuits": size,
        "wall_s": wall,
        "admitted_s": admitted,
        "circuits_per_s": size / wall,
        "runs_per_s": len(all_ids) / wall,
        "p50_ms": stack.pct(latencies, 0.5),
        "p99_ms": stack.pct(latencies, 0.99),
        "peak_parked": sampler.peak,
        "completed": completed,
        "runs": len(all_ids),
        "valid": validate(started),
        "cpu_ms": cpu,  # type: ignore[dict-item]
    }


def validate(started: dict[int, list[str]]) -> int:
    """Circuits whose three memory keys and editor evaluation all exist."""
    good = 0
    for n, (_, editor_id, _) in started.items():
        keys = {f"c{n}-research", f"c{n}-research-edited", f"c{n}-research-scored"}
        found = set(
            MemoryEntry.objects.filter(scope="user", scope_id=_user(n), key__in=keys).values_list("key", flat=True)
        )
        evaluated = Evaluation.objects.filter(run_id=editor_id).exists()
        good += found == keys and evaluated
    return good


def peer(levels: list[int]) -> dict[str, float]:
    if not PEER:
        return {}
    if not PEER_PYTHON.exists():
        print("langgraph: skipped (no .venv-peer; `make bench-circuit` creates it)", flush=True)
        return {}
    argv = [str(PEER_PYTHON), str(ROOT / "bench" / "langgraph_circuit.py"), "--dsn", os.environ["DATABASE_URL"]]
    argv += ["--levels", ",".join(map(str, levels))]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    sys.stdout.write("".join(f"  | {line}\n" for line in proc.stdout.splitlines()))
    if proc.returncode != 0:
        print(f"langgraph peer failed ({proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
        return {}
    last = proc.stdout.strip().splitlines()[-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.eE+a-z]+)", last) if _number(v)}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    with connection.cursor() as cur:
        cur.execute(
            "TRUNCATE runs_run, runs_runevent, runs_transcriptentry, runs_runinput, runs_toolcallrecord, "
            "agent_channels_channelmessage, agent_channels_channelcursor, agent_channels_channelwait, "
            "memory_memoryentry, evaluations_evaluation CASCADE"
        )
        cur.execute("DELETE FROM substrate_channeldef WHERE source = 'runtime'")
    sync_client().delete("runs", "maintenance")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    print(
        f"circuit bench: {os.cpu_count()} cores, {WORKERS} worker processes x {CONCURRENCY} threads; "
        f"levels {LEVELS} concurrent circuits (3 runs each) on the zero-latency mock",
        flush=True,
    )
    workers = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="circuit",
        count=WORKERS,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )
    beat = stack.start_beat(env, DATA)
    results: dict[int, dict[str, float]] = {}
    # CPU of each process group per level (Postgres backends that exit during a level are not counted).
    groups = {"workers": [p.pid for p in workers], "beat": [beat.pid], "driver": [os.getpid()]}
    try:
        level(2, 900_001, groups)  # warm-up: pools, caches, threads
        first = 1
        for size in LEVELS:
            r = results[size] = level(size, first, groups)
            first += size
            print(
                f"x{size:<4} {r['circuits_per_s']:.1f} circuits/s, {r['runs_per_s']:.1f} runs/s "
                f"({size} circuits in {r['wall_s']:.2f} s, all started after {r['admitted_s']:.2f} s); "
                f"circuit latency p50 {r['p50_ms']:.0f} ms, "
                f"p99 {r['p99_ms']:.0f} ms; peak parked {r['peak_parked']}; "
                f"completed {r['completed']}/{r['runs']} runs; valid {r['valid']}/{size} circuits; "
                f"{r['iterations_per_s']:.0f} iterations/s, iteration wall p50 {r['iteration_p50_ms']:.1f} ms "
                f"p99 {r['iteration_p99_ms']:.1f} ms",
                flush=True,
            )
            cpu = r["cpu_ms"]
            print("      cpu ms/circuit: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items()), flush=True)  # type: ignore[attr-defined]
    finally:
        stack.stop_all([*workers, beat])
    lg = peer(LEVELS)
    for size in LEVELS:
        theirs = lg.get(f"lg_runs_per_s_{size}")
        if theirs:
            ratio = results[size]["runs_per_s"] / theirs
            print(f"x{size:<4} vs LangGraph: {results[size]['runs_per_s']:.1f} / {theirs:.1f} runs/s = {ratio:.2f}")
    pairs = []
    for size, r in results.items():
        pairs += [
            f"circuits_per_s_{size}={r['circuits_per_s']:.2f}",
            f"runs_per_s_{size}={r['runs_per_s']:.2f}",
            f"p50_ms_{size}={r['p50_ms']:.0f}",
            f"p99_ms_{size}={r['p99_ms']:.0f}",
            f"peak_parked_{size}={r['peak_parked']}",
            f"valid_{size}={r['valid']}",
        ]
        if lg.get(f"lg_runs_per_s_{size}"):
            pairs.append(f"lg_runs_per_s_{size}={lg[f'lg_runs_per_s_{size}']:.2f}")
    print(" ".join(pairs))


if __name__ == "__main__":
    try:
        main()
    finally:
        connection.close()
        SERVICES.stop()
