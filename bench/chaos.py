#!/usr/bin/env python
"""The large chaos run (issue 25, `make chaos`; `make chaos N=1000` is the published one).

On its own embedded Postgres and Redis (.loomcycle/chaos): CHAOS_WORKERS Celery
worker processes (threads pool, as `make run` starts them), beat and
CHAOS_WEBS Daphne web processes, all on loopback. A mixed workload of CHAOS_N
runs goes through the public HTTP API (bench/chaos_driver.py): tool-calling
runs with model latency (each turn publishes to a channel and writes a memory
key), sub-agent spawns, runs parked on a channel subscribe woken by a publish,
interactive runs answered once then ended, and runs consumed over SSE.

Faults come at random times from a seeded RNG (CHAOS_SEED, printed), one kind
per phase and then all kinds mixed (FAULTS below, one function each): SIGKILL
of a worker (the pool topped up), of beat (restarted), of a web process while
SSE clients read from it (restarted; the clients reattach from their last
seq), SIGSTOP of a worker past its lease then SIGCONT, duplicated and
reordered doorbells pushed into the broker, an embedded Redis restart with
its data lost, and a Postgres restart (pg_ctl restart of the embedded cluster).

Afterwards the engine's contract is checked through SQL and the API
(tests/chaos/harness.py, shared with the small run, plus the SSE readers'
frames, and no fairness or admission slot left held), and the figures are
printed: runs, faults by kind, violations, recovery after each fault kind
(p50/p100 over its faults of: fault -> every affected run progressing again),
wall time, the seed, the load average and the host's CPU steal.

Bounded: CHAOS_DEADLINE_S for the whole run; every process started is
stopped, on failure and Ctrl-C too.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "chaos"
N = int(os.environ.get("CHAOS_N", "60"))
SEED = int(os.environ.get("CHAOS_SEED", str(random.SystemRandom().randrange(1, 10**6))))
WORKERS = int(os.environ.get("CHAOS_WORKERS", "4"))
WEBS = int(os.environ.get("CHAOS_WEBS", "2"))
DEADLINE_S = float(os.environ.get("CHAOS_DEADLINE_S", "2400"))

from bench import stack  # noqa: E402

SERVICES = stack.boot(
    DATA,
    stack.BENCH / "chaos.yaml",
    load=False,
    # Engine timings short enough that a killed worker's runs resume within seconds (as the tests run).
    LOOMCYCLE_LEASE_SECONDS="5",
    LOOMCYCLE_HEARTBEAT_SECONDS="1",
    LOOMCYCLE_SWEEP_SECONDS="1",
    LOOMCYCLE_REQUEUE_GRACE_SECONDS="10",
    LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS="600000",
    # Fairness and admission on, so their slots are tracked (and checked for leaks afterwards).
    LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER="4",
    LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT="100000",
    LOOMCYCLE_MAX_CONCURRENT_RUNS="48",
    LOOMCYCLE_MAX_QUEUE_DEPTH="10000",
    LOOMCYCLE_FLOWER_ENABLED="0",
)

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from bench import chaos_report  # noqa: E402
from bench.chaos_driver import Driver, kinds  # noqa: E402
from bench.chaos_stack import Stack  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from tests.chaos import harness  # noqa: E402
from tests.chaos.harness import Fault  # noqa: E402

# The share of CHAOS_DEADLINE_S each phase may spend injecting its faults (then it only drains).
BUDGET = {"kill_worker": 0.4, "kill_web": 0.08, "mixed": 0.15}
WINDOW = 64  # live runs at most (admission admits 48 of them; the rest wait for a slot)


class Chaos:
    """The run's state: the stack, the driver, the RNG and the faults so far."""

    def __init__(self, stack: Stack, driver: Driver, rng: random.Random) -> None:
        self.stack, self.driver, self.rng = stack, driver, rng
        self.faults: list[Fault] = []
        self.extra = 0  # tool runs added past N to keep work in flight for a fault
        self.stuck: list[str] = []  # bounded waits that ran out (each a finding)
        self.cut: list[str] = []  # phases whose time budget ended their faults early (printed)

    # --- one function per fault kind -------------------------------------------------------

    def kill_worker(self) -> Fault:
        return harness.kill_worker(self.stack.pool, self.rng, keep=1)

    def kill_beat(self) -> Fault:
        fault = Fault("kill_beat", harness.db_now(), harness.in_flight())
        self.stack.kill_beat()
        return fault

    def kill_web(self) -> Fault:
        """SIGKILL the web serving the most SSE readers (waits up to 120 s for one); restarted on
        its port. Recovery: until every reader it served has a stream again (from another web, or
        this one restarted)."""
        bases = self.stack.bases()
        if not any(r.base or not r.finished for r in self.driver.readers):  # none streaming nor about to
            self.extra += 1
            self.driver.pending.insert(0, (N + self.extra, "sse"))
        attached = lambda: self.driver.tick() or [r for r in self.driver.readers if r.base]  # noqa: E731
        busy = harness.wait_until(attached, 120, "an SSE reader attached", 0.1)
        target = max(bases, key=lambda b: sum(r.base == b for r in busy))
        hit = [r for r in busy if r.base == target]
        before = {r.run_id: r.attaches for r in hit}
        fault, t0 = Fault("kill_web", harness.db_now(), [r.run_id for r in hit]), time.monotonic()
        self.stack.kill_web(bases.index(target))
        harness.wait_until(
            lambda: all(r.attaches > before[r.run_id] or r.finished for r in hit), 120, "SSE readers reattached"
        )
        fault.measured = max((r.reattach_s[-1] if r.reattach_s else time.monotonic() - t0 for r in hit), default=None)
        return fault

    def stall_worker(self) -> Fault:
        return harness.stall_worker(self.stack.pool, keep=1)

    def doorbells(self) -> Fault:
        return harness.duplicate_doorbells(self.rng, 8)

    def restart_redis(self) -> Fault:
        fault = Fault("restart_redis", harness.db_now(), harness.in_flight())
        self.stack.restart_redis()
        return fault

    def restart_postgres(self) -> Fault:
        fault = Fault("restart_postgres", harness.db_now(), harness.in_flight())
        self.stack.restart_postgres()
        return fault

    def _ready(self, pause: float) -> bool:
        """One driver tick; True once `pause` passed with work in flight. A phase whose runs all
        ended before its faults did gets one more tool run (an index past N), so every fault
        meets work."""
        self.driver.tick()
        if not self.driver.live and not self.driver.pending:
            self.extra += 1
            self.driver.pending.append((N + self.extra, "tool"))
        return time.monotonic() >= pause and bool(harness.in_flight())

    # --- phases ----------------------------------------------------------------------------

    def phase(
        self, name: str, runs: list[tuple[int, str]], faults: list[Callable[[], Fault]], gap: tuple[float, float]
    ) -> None:
        """Submit `runs`, inject `faults` one by one at random gaps (seconds) while work is in
        flight, then let every run end."""
        self.driver.phase = name
        self.driver.pending.extend(runs)
        t0, before = time.monotonic(), len(self.faults)
        budget = t0 + BUDGET.get(name, 0.05) * DEADLINE_S
        try:
            for n, fault in enumerate(faults):
                if time.monotonic() > budget:  # a slow host: the later phases keep their time
                    self.cut.append(
                        f"{name}: {n} of {len(faults)} faults within its {BUDGET.get(name, 0.05):.0%} budget"
                    )
                    break
                pause = time.monotonic() + self.rng.uniform(*gap)
                harness.wait_until(lambda p=pause: self._ready(p), 120, f"work in flight for a {name} fault", 0.1)
                self.faults.append(fault())
            self.driver.drain(max(DEADLINE_S - (time.monotonic() - START), 1))
        except TimeoutError as exc:  # reported with the figures: the contract check shows what it left
            self.stuck.append(f"[{name}] {exc}")
        kinds = sorted({f.kind for f in self.faults[before:]})
        print(
            f"phase {name}: {len(runs)} runs, {len(self.faults) - before} faults {kinds}, "
            f"{time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


START = time.monotonic()


def plan(chaos: Chaos) -> list[tuple[str, list[tuple[int, str]], list[Callable[[], Fault]], tuple[float, float]]]:
    """The phases: each kind alone, then all mixed. N//10 kills in the kill phase (>= 100 at N=1000)."""
    per = max(1, N // 333)
    table: dict[str, tuple[Callable[[], Fault], int, float]] = {  # fault, count, share of the runs
        "kill_worker": (chaos.kill_worker, max(3, N // 10), 0.30),
        "kill_beat": (chaos.kill_beat, per, 0.06),
        "kill_web": (chaos.kill_web, per, 0.10),
        "stall_worker": (chaos.stall_worker, per, 0.06),
        "doorbells": (chaos.doorbells, max(1, N // 100), 0.06),
        "restart_redis": (chaos.restart_redis, per, 0.08),
        "restart_postgres": (chaos.restart_postgres, per, 0.08),
    }
    out, i = [], 0
    for name, (fn, count, share) in table.items():
        n = max(4, int(N * share))
        out.append(
            (
                name,
                kinds(range(i, i + n), name == "kill_web"),
                [fn] * count,
                (0.3, 1.5) if name == "kill_worker" else (1.0, 4.0),
            )
        )
        i += n
    mixed = [fn for fn, count, _ in table.values() for _ in range(max(1, count // 5))]
    chaos.rng.shuffle(mixed)
    out.append(("mixed", kinds(range(i, max(N, i + 4)), streamed=False), mixed, (0.5, 2.0)))
    return out


def reset() -> None:
    """A fresh database and Redis for this run (the data dir persists between runs)."""
    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    sync_client().flushall()
    load_yaml_config()


def main() -> None:
    reset()
    rng = random.Random(SEED)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logdir = DATA / "logs" / time.strftime("%Y%m%d-%H%M%S")
    print(f"chaos: N={N} seed={SEED}, {WORKERS} workers x 32 threads, {WEBS} web processes; logs {logdir}", flush=True)
    stack = Stack.start(env, logdir, SERVICES, DATA, WORKERS, WEBS)
    host0, load0 = psutil.cpu_times(), os.getloadavg()[0]
    try:
        harness.wait_until(lambda: all(harness.worker_id(p) for p in stack.pool.pids()), 120, "workers registered")
        driver = Driver(stack.bases, rng, WINDOW, deadline=time.monotonic() + DEADLINE_S)
        chaos = Chaos(stack, driver, rng)
        for name, runs, faults, gap in plan(chaos):
            if time.monotonic() - START > DEADLINE_S:
                chaos.stuck.append(f"[{name}] not run: the deadline ({DEADLINE_S:.0f} s) had passed")
                continue
            chaos.phase(name, runs, faults, gap)
        for reader in driver.readers:
            reader.join(5)  # each ends once its run did
        wall = time.monotonic() - START
        for line in chaos.cut:
            print(f"cut short: {line}", flush=True)
        steal = stack_steal(host0)
        chaos_report.report(
            chaos.stuck,
            chaos.driver,
            chaos.faults,
            n=N,
            seed=SEED,
            wall=wall,
            load=(load0, os.getloadavg()[0]),
            steal=steal,
        )
    finally:
        stack.stop()


def stack_steal(before: object) -> float:
    from bench.stack import host_steal_pct

    return host_steal_pct(before, psutil.cpu_times())


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # SIGTERM (and a background job's ignored SIGINT) still unwinds the finally


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    try:
        main()
    finally:
        connection.close()
        SERVICES.stop()
