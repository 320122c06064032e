"""What the benchmarks share: their start-up (`boot`: environment, embedded Postgres and
Redis, Django), Celery workers and beat as child processes (stopped by the caller, bounded
waits), RSS and CPU of process trees, percentiles."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from loomcycle_project.embedded import EmbeddedServices

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# A load run: the shipped per-user/per-tenant run caps (64/256, docs/configuration.md) would refuse most of it.
NO_RUN_CAPS = {"LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "0", "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": "0"}
INSTANT_MOCK = {"LOOMCYCLE_MOCK_LATENCY_MS": "0", "LOOMCYCLE_MOCK_LATENCY_JITTER_MS": "0"}


def boot(data: Path, *configs: Path, load: bool = True, instant_mock: bool = True, **env: str) -> EmbeddedServices:
    """The start-up every bench script shares, before it imports anything of the runtime: the
    environment (its data dir, its yaml files, WARNING logs, the settings module; with `load`
    the run caps off (NO_RUN_CAPS), with `instant_mock` a mock provider without latency; then
    `env`, which wins), the embedded Postgres and Redis under `data` (stopped at exit), and
    Django set up. Returns the embedded services."""
    values = {
        "LOOMCYCLE_DATA_DIR": str(data),
        "LOOMCYCLE_LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings",
        **({"LOOMCYCLE_CONFIG_FILES": ":".join(str(c) for c in configs)} if configs else {}),
        **(NO_RUN_CAPS if load else {}),
        **(INSTANT_MOCK if instant_mock else {}),
    }
    os.environ.update({**values, **env})
    from loomcycle_project.embedded import ensure_services

    services = ensure_services(data)
    import django

    django.setup()
    return services


def start_workers(
    app: Any,
    *,
    argv_app: list[str],
    queues: str,
    env: dict[str, str],
    tag: str,
    count: int,
    concurrency: int,
    logdir: Path,
    cwd: Path = ROOT,
) -> list[subprocess.Popen[bytes]]:
    """`count` threads-pool workers running the code under `cwd` (this checkout by default);
    returns once each answers a ping (60 s at most)."""
    procs = []
    for i in range(count):
        argv = [
            sys.executable,
            "-m",
            "celery",
            *argv_app,
            "worker",
            "--pool",
            "threads",
            "-c",
            str(concurrency),
            "-Q",
            queues,
            "-n",
            f"{tag}{i}@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ]
        procs.append(spawn(argv, env, logdir / f"{tag}{i}.log", cwd=cwd))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=1.0) or []
        if sum(1 for r in replies for name in r if name.startswith(tag)) >= count:
            return procs
    stop_all(procs)
    raise SystemExit(f"{tag} workers did not come up; see {logdir}/{tag}*.log")


def start_beat(env: dict[str, str], logdir: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "celery", "-A", "workers.celery:app", "beat", "--loglevel", "WARNING"]
    return spawn([*argv, "-s", str(logdir / "beat-schedule")], env, logdir / "beat.log", cwd=cwd)


def spawn(argv: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("ab")
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(5)


def rss_mib(procs: list[subprocess.Popen[bytes]]) -> float:
    total = 0
    for p in procs:
        try:
            proc = psutil.Process(p.pid)
            total += proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[pid] = t.user + t.system
    return out


def host_steal_pct(before: Any, after: Any) -> float:
    """Share of the host's CPU time stolen by the hypervisor between two `psutil.cpu_times()`.

    On a shared VM a phase's figures move with it: this host has shown 0-40 %.
    """
    # /proc/stat counts guest time inside user and nice time already
    fields = [f for f in after._fields if f not in ("guest", "guest_nice")]
    total = sum(getattr(after, f) - getattr(before, f) for f in fields)
    return 100.0 * (getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)) / total if total > 0 else 0.0


def service_pids() -> dict[str, list[int]]:
    """This bench's own Postgres (its postmaster and backends) and Redis, found under its data dir
    (LOOMCYCLE_DATA_DIR, set by `boot`): other embedded servers on the host (tests, other checkouts)
    are not counted."""
    data = Path(os.environ["LOOMCYCLE_DATA_DIR"]).resolve()
    out: dict[str, list[int]] = {"postgres": [], "redis": []}
    for pidfile in data.glob("**/postmaster.pid"):
        try:
            master = psutil.Process(int(pidfile.read_text().split()[0]))
            out["postgres"] += [master.pid, *(c.pid for c in master.children(recursive=True))]
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            continue
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        name = proc.info["name"] or ""
        if name.startswith(("redis-server", "valkey-server")) and str(data) in " ".join(proc.info["cmdline"] or []):
            out["redis"].append(proc.info["pid"])
    return out


def service_cpu() -> dict[str, dict[int, float]]:
    """CPU seconds of this bench's Postgres and Redis processes, by pid (`service_cpu_delta`)."""
    return {group: cpu_by_pid(pids) for group, pids in service_pids().items()}


def service_cpu_delta(before: dict[str, dict[int, float]]) -> dict[str, float]:
    """CPU seconds each service group spent since `before`, a backend started since then
    (a pool that grew under load) counted whole; one that exited meanwhile is not counted."""
    after = service_cpu()
    return {g: sum(cpu - before.get(g, {}).get(pid, 0.0) for pid, cpu in pids.items()) for g, pids in after.items()}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def timing_samples(client: Any, key: str) -> list[tuple[float, float, float]]:
    """The workers' (total ms, provider ms, admission wait ms) samples; waits out their buffered flush."""
    from apps.runs.dispatch import TIMINGS_FLUSH_S

    time.sleep(TIMINGS_FLUSH_S * 3)
    return [(float(a), float(b), float(c)) for a, b, c in (s.decode().split(",") for s in client.lrange(key, 0, -1))]
