#!/usr/bin/env python
"""Rolling deploy under load (issue 25, `make rolling-deploy RUNS=500`).

On its own embedded Postgres and Redis (.loomcycle/rolling): old workers (2
processes, threads pool, ROLLING_CONCURRENCY threads each as `make run` starts
them) and beat from THIS checkout run RUNS runs of several tool-calling
iterations, each model call taking ROLLING_LATENCY_MS (mock-script): plain
tool runs, runs that spawn a child, runs that ask a human (Interruption, parked
`awaiting_interrupt`) and interactive runs (parked `awaiting_input` after their
first turn). Once ROLLING_DEPLOY_AT of the iterations have committed, the
deploy starts:

1. a newer checkout: a `git clone --shared` of HEAD into a temp dir, patched
   with (a) a changed Context tool description and (b) a new migration adding
   a nullable column to runs_run (expand);
2. that checkout's `manage.py migrate` against the live database;
3. new workers (same shape) and a new beat from it, with a new
   LOOMCYCLE_WORKER_VERSION; the old beat is stopped;
4. the parked asks and interactive runs are answered, and the second wave of
   runs is created (ROLLING_WAVE2 of the plain tool runs: traffic goes on
   during the deploy, so runs are mid-flight on both versions at the cut);
5. the old workers are warm-stopped (SIGTERM: Celery's warm shutdown lets the
   iterations they run commit; doorbells they had taken go back to the queue).

Then, through SQL: every run completed (an interactive run ran both turns and
is parked for its next input), none paused or failed; per-run event seqs and
transcript idxs consecutive; one tool record per call id, each finished, as
many as the scripts make; each iteration's events carry one worker_version,
old or new, only new after the cut-over; every Context result an iteration of
the new version returned carries the new description, every old one the old.
Printed: iterations per version, the deploy's phases and total, iterations
retried (the workers' "claimed again" and "fence lost" log lines), and the
load average and host steal during the run. Every process it starts is stopped
and the temp checkout removed, also on failure or Ctrl-C. Loopback only.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "rolling"
RUNS = int(os.environ.get("ROLLING_RUNS", "500"))
LATENCY_MS = int(os.environ.get("ROLLING_LATENCY_MS", "2000"))
CONCURRENCY = int(os.environ.get("ROLLING_CONCURRENCY", "64"))
DEPLOY_AT = float(os.environ.get("ROLLING_DEPLOY_AT", "0.05"))
WAVE2 = float(os.environ.get("ROLLING_WAVE2", "0.6"))
DEADLINE_S = float(os.environ.get("ROLLING_DEADLINE_S", "1200"))
STOP_GRACE_S = 180.0  # the old workers' warm shutdown: their running iterations commit first

OLD_DESCRIPTION = "Introspect the current run:"
NEW_DESCRIPTION = "Introspect the current run (next release):"
PROBE_COLUMN = "deploy_probe"
PROBE_MIGRATION = "9999_rolling_probe"

from bench import stack  # noqa: E402

SERVICES = stack.boot(DATA, stack.BENCH / "rolling.yaml", instant_mock=False)

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from apps.core.types import Principal  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.interrupts import services as interrupts  # noqa: E402
from apps.runs.models import Interrupt, Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from bench import stack  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

OPS = Principal(tenant_id="", subject="rolling", scopes=frozenset({"substrate:admin"}))
TRUNCATE = (
    "TRUNCATE runs_run, runs_runevent, runs_transcriptentry, runs_runinput, runs_toolcallrecord, "
    "runs_interrupt, runs_signaloutbox CASCADE"
)


# --- the workload -------------------------------------------------------------------------


def _tool(latency: int = LATENCY_MS) -> dict[str, Any]:
    return {"tool": "Context", "input": {"op": "tools"}, "sleep_ms": latency}


def _text(text: str) -> dict[str, Any]:
    return {"text": text, "sleep_ms": LATENCY_MS}


LEAF = [_tool(), _tool(), _text("leaf done")]
ASK = {"op": "ask", "question": "deploy now?", "options": ["yes", "no"], "timeout_ms": 3_600_000}


@dataclass(frozen=True)
class Kind:
    """One kind of run: its agent, script, share of RUNS, and what it does when it works."""

    agent: str
    script: list[dict[str, Any]]
    share: float
    iterations: int  # committed iterations of the run itself (its children not counted)
    tool_calls: int  # tool records of the run itself
    end: str  # the status it ends in (an interactive run parks for its next input)
    children: int = 0


KINDS = {
    "tools": Kind("roll-tools", [_tool()] * 8 + [_text("done")], 0.65, 9, 8, RunStatus.COMPLETED),
    "spawn": Kind(
        "roll-spawner",
        [
            _tool(),
            {"tool": "Agent", "input": {"name": "roll-tools", "prompt": "MOCK_SCRIPT: " + json.dumps(LEAF)}},
            _tool(),
            _text("done"),
        ],
        0.15,
        4,
        3,
        RunStatus.COMPLETED,
        children=1,
    ),
    "ask": Kind(
        "roll-asker",
        [_tool(), {"tool": "Interruption", "input": ASK}, _tool(), _tool(), _tool(), _text("done")],
        0.10,
        6,
        5,
        RunStatus.COMPLETED,
    ),
    "chat": Kind(
        "roll-chat",
        [_tool(), _text("turn one"), _tool(), _tool(), _tool(), _text("turn two")],
        0.10,
        6,
        4,
        RunStatus.AWAITING_INPUT,
    ),
}
LEAF_ITERATIONS, LEAF_TOOL_CALLS = 3, 2


def counts() -> dict[str, int]:
    """How many runs of each kind make up RUNS (plain tool runs take the rounding)."""
    out = {name: int(RUNS * kind.share) for name, kind in KINDS.items() if name != "tools"}
    return {"tools": RUNS - sum(out.values()), **out}


def create(kind: str) -> str:
    spec = KINDS[kind]
    data = services.RunCreate(agent=spec.agent, segments=[Segment(text="MOCK_SCRIPT: " + json.dumps(spec.script))])
    try:
        return services.run_create(principal=OPS, data=data).id
    finally:
        connection.close()


def waves() -> tuple[list[str], list[str]]:
    """The kinds of the runs created before the deploy, and of those created once the new
    workers are up (WAVE2 of the plain tool runs: traffic that goes on during the deploy)."""
    n = counts()
    later = int(n["tools"] * WAVE2)
    first = [kind for kind, k in n.items() for _ in range(k - (later if kind == "tools" else 0))]
    return first, ["tools"] * later


def create_all(plan: list[str], into: dict[str, list[str]]) -> None:
    """Create the runs of `plan` (kinds), adding their ids to `into` by kind."""
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(create, plan))
    for kind, run_id in zip(plan, ids, strict=True):
        into.setdefault(kind, []).append(run_id)


def expected_iterations(n: dict[str, int]) -> int:
    runs = sum(KINDS[k].iterations * n[k] for k in KINDS)
    return runs + sum(KINDS[k].children * n[k] for k in KINDS) * LEAF_ITERATIONS


# --- SQL helpers ------------------------------------------------------------------------


def sql(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


def one(query: str, params: tuple[Any, ...] = ()) -> Any:
    return sql(query, params)[0][0]


def committed_iterations() -> int:
    return int(one("SELECT COALESCE(sum(step), 0) FROM runs_run"))


def wait(predicate: Any, what: str, timeout: float) -> float:
    """Poll `predicate` (bounded); the monotonic time it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.25)
    states = dict(sql("SELECT status, count(*) FROM runs_run GROUP BY status"))
    raise SystemExit(f"{what}: not within {timeout:.0f} s (runs by status: {states}); logs in {DATA}")


def parked(ids: list[str], status: str) -> bool:
    return Run.objects.filter(id__in=ids, status=status).count() == len(ids)


# --- the newer checkout -----------------------------------------------------------------


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def newer_checkout(into: Path) -> str:
    """A clone of HEAD under `into`, patched as the next release; returns HEAD's commit."""
    head = git("rev-parse", "HEAD")
    git("clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(into))
    git("checkout", "--quiet", "--detach", head, cwd=into)
    tools = into / "apps" / "runs" / "tools.py"
    text = tools.read_text()
    if OLD_DESCRIPTION not in text:
        raise SystemExit(f"the Context tool's description no longer starts with {OLD_DESCRIPTION!r}")
    tools.write_text(text.replace(OLD_DESCRIPTION, NEW_DESCRIPTION, 1))
    models = into / "apps" / "runs" / "models.py"
    anchor = '    error = models.TextField(blank=True, default="")\n'
    body = models.read_text()
    if anchor not in body:
        raise SystemExit("runs.Run has no `error` field to add the probe column after")
    probe = f"    {PROBE_COLUMN} = models.TextField(null=True, blank=True)  # bench/rolling.py: an expand migration\n"
    models.write_text(body.replace(anchor, anchor + probe, 1))
    migrations = into / "apps" / "runs" / "migrations"
    latest = max(p.stem for p in migrations.glob("[0-9][0-9][0-9][0-9]_*.py"))
    (migrations / f"{PROBE_MIGRATION}.py").write_text(
        "from django.db import migrations, models\n\n\n"
        "class Migration(migrations.Migration):\n"
        f"    dependencies = [('runs', '{latest}')]\n"
        "    operations = [\n"
        f"        migrations.AddField(model_name='run', name='{PROBE_COLUMN}', "
        "field=models.TextField(null=True, blank=True)),\n"
        "    ]\n"
    )
    return head


def migrate(checkout: Path, env: dict[str, str]) -> str:
    argv = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "2"]  # -v 2: each migration's time
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the new checkout's migrate failed:\n{done.stdout}\n{done.stderr}")
    return " ".join(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("Applying"))


def reset_probe() -> None:
    """Undo a previous run's probe migration (its column and its row), so this run's new
    checkout applies it against the live database again."""
    sql(f"ALTER TABLE runs_run DROP COLUMN IF EXISTS {PROBE_COLUMN}")
    sql("DELETE FROM django_migrations WHERE app = 'runs' AND name = %s", (PROBE_MIGRATION,))


# --- the deploy -------------------------------------------------------------------------


@dataclass
class Deploy:
    old_version: str
    new_version: str
    phases: dict[str, float] = field(default_factory=dict)
    migration: str = ""
    live_at_stop: int = 0
    leased_by_old: list[tuple[str, int]] = field(default_factory=list)
    started_at: float = 0.0
    cut_at: Any = None  # Postgres's clock when every old worker had exited


def owner_prefix(pid: int) -> str:
    return f"{os.uname().nodename}:{pid}:"


def leased_by(pids: list[int]) -> list[tuple[str, int]]:
    rows = sql("SELECT id, step, lease_owner FROM runs_run WHERE lease_owner <> ''")
    prefixes = tuple(owner_prefix(p) for p in pids)
    return [(run_id, step) for run_id, step, owner in rows if owner.startswith(prefixes)]


def answer(ids: dict[str, list[str]]) -> None:
    pending = list(Interrupt.objects.filter(run_id__in=ids["ask"], status="pending").values_list("id", "run_id"))

    def resolve(item: tuple[str, str]) -> None:
        try:
            reply = interrupts.Resolve(answer="yes", resolved_by="rolling")
            interrupts.interrupt_resolve(tenant_id=None, owner=None, run_id=item[1], interrupt_id=item[0], reply=reply)
        finally:
            connection.close()

    def reply(run_id: str) -> None:
        try:
            services.run_input(principal=OPS, run_id=run_id, text="go on")
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(resolve, pending))
        list(pool.map(reply, ids["chat"]))


class Fleet:
    """Every process the bench started, stopped (SIGTERM, then SIGKILL past a bound) in `close`."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def add(self, *procs: subprocess.Popen[bytes]) -> None:
        self.procs.extend(procs)

    def close(self) -> None:
        stack.stop_all(self.procs)


def deploy(
    fleet: Fleet,
    checkout: Path,
    old: list[subprocess.Popen[bytes]],
    old_beat: Any,
    ids: dict[str, list[str]],
    second: list[str],
) -> Deploy:
    """Steps 1-5 of the module docstring, timed; returns once every old worker has exited."""
    info = Deploy(
        old_version=settings.LOOMCYCLE.worker_version, new_version=f"{settings.LOOMCYCLE.worker_version}.next"
    )
    info.started_at = t = time.monotonic()
    newer_checkout(checkout)
    info.phases["newer checkout (clone + patch)"], t = time.monotonic() - t, time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOOMCYCLE_WORKER_VERSION": info.new_version}
    info.migration = migrate(checkout, env)
    info.phases["migrate (expand) on the live database"], t = time.monotonic() - t, time.monotonic()
    new = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="new",
        count=2,
        concurrency=CONCURRENCY,
        logdir=DATA,
        cwd=checkout,
    )
    fleet.add(*new)
    fleet.add(stack.start_beat(env, DATA / "new-beat", cwd=checkout))
    stack.stop_all([old_beat])
    info.phases["new workers up, beat replaced"], t = time.monotonic() - t, time.monotonic()
    answer(ids)
    info.phases["parked runs answered"], t = time.monotonic() - t, time.monotonic()
    create_all(second, ids)
    info.phases["second wave of runs created"], t = time.monotonic() - t, time.monotonic()
    info.live_at_stop = Run.objects.exclude(status__in=[RunStatus.COMPLETED, RunStatus.FAILED]).count()
    info.leased_by_old = leased_by([p.pid for p in old])
    for p in old:
        p.send_signal(signal.SIGTERM)  # Celery's warm shutdown
    for p in old:
        p.wait(STOP_GRACE_S)
    info.cut_at = one("SELECT now()")
    info.phases["old workers warm-stopped"] = time.monotonic() - t
    if bad := [p.returncode for p in old if p.returncode != 0]:
        raise SystemExit(f"an old worker did not exit cleanly on SIGTERM: exit codes {bad}")
    return info


# --- the checks -------------------------------------------------------------------------


def violations(ids: dict[str, list[str]], info: Deploy) -> dict[str, int]:
    """Each check of the engine's contract, and how many rows break it (all must be 0)."""
    n = counts()
    tops = [r for v in ids.values() for r in v]
    out = {
        "runs not ended as their kind should": sum(
            Run.objects.filter(id__in=ids[k]).exclude(status=KINDS[k].end).count() for k in KINDS
        ),
        "children not completed": Run.objects.filter(parent_id__in=ids["spawn"])
        .exclude(status=RunStatus.COMPLETED)
        .count(),
        "runs paused or failed": Run.objects.filter(status__in=[RunStatus.PAUSED, RunStatus.FAILED]).count(),
        "runs not at their scripted step": sum(
            Run.objects.filter(id__in=ids[k]).exclude(step=KINDS[k].iterations).count() for k in KINDS
        )
        + Run.objects.filter(parent_id__in=ids["spawn"]).exclude(step=LEAF_ITERATIONS).count(),
        "children missing": n["spawn"] - Run.objects.filter(parent_id__in=ids["spawn"]).count(),
        "event seqs not consecutive": one(
            "SELECT count(*) FROM (SELECT run_id FROM runs_runevent GROUP BY run_id "
            "HAVING min(seq) <> 1 OR max(seq) <> count(*) OR count(*) <> count(DISTINCT seq)) x"
        ),
        "runs whose last_seq is not their last event": one(
            "SELECT count(*) FROM runs_run r WHERE r.last_seq <> "
            "(SELECT COALESCE(max(seq), 0) FROM runs_runevent e WHERE e.run_id = r.id)"
        ),
        "transcript idxs not consecutive": one(
            "SELECT count(*) FROM (SELECT run_id FROM runs_transcriptentry GROUP BY run_id "
            "HAVING min(idx) <> 0 OR max(idx) <> count(*) - 1) x"
        ),
        "tool call ids recorded twice": one(
            "SELECT count(*) FROM (SELECT 1 FROM runs_toolcallrecord GROUP BY run_id, call_id HAVING count(*) > 1) x"
        ),
        "tool records not finished": one("SELECT count(*) FROM runs_toolcallrecord WHERE status <> 'finished'"),
        "tool records missing (or extra)": abs(
            expected_tool_calls(n) - one("SELECT count(*) FROM runs_toolcallrecord")
        ),
        "iterations with two versions": one(
            "SELECT count(*) FROM (SELECT 1 FROM runs_runevent WHERE worker_version <> '' "
            "GROUP BY run_id, step HAVING count(DISTINCT worker_version) > 1) x"
        ),
        "iterations of neither version": one(
            "SELECT count(*) FROM runs_runevent WHERE worker_version NOT IN ('', %s, %s)",
            (info.old_version, info.new_version),
        ),
        "old-version events after the cut-over": one(
            "SELECT count(*) FROM runs_runevent WHERE created_at > %s AND worker_version = %s",
            (info.cut_at, info.old_version),
        ),
        "Context results of the wrong release": wrong_descriptions(info),
        "iterations the old workers held at SIGTERM not committed by them": held_not_committed(info),
        "leases left held": Run.objects.exclude(lease_owner="").count(),
        "top-level runs missing": RUNS - len(set(tops)),
    }
    return {k: int(v) for k, v in out.items()}


def expected_tool_calls(n: dict[str, int]) -> int:
    return sum(KINDS[k].tool_calls * n[k] for k in KINDS) + n["spawn"] * LEAF_TOOL_CALLS


def wrong_descriptions(info: Deploy) -> int:
    """Context results whose description is not the release of the worker that ran the call."""
    return int(
        one(
            "SELECT count(*) FROM runs_runevent WHERE type = 'tool_result' "
            "AND payload->'tool_use'->>'name' = 'Context' AND ("
            "(worker_version = %s AND strpos(payload->>'text', %s) = 0) OR "
            "(worker_version = %s AND strpos(payload->>'text', %s) = 0))",
            (info.old_version, OLD_DESCRIPTION, info.new_version, NEW_DESCRIPTION),
        )
    )


def held_not_committed(info: Deploy) -> int:
    """Of the iterations the old workers held a lease on at SIGTERM, those whose events are not
    the old version's (a warm shutdown lets them commit; none was cut and repeated)."""
    missing = 0
    for run_id, step in info.leased_by_old:
        versions = {
            v
            for (v,) in sql(
                "SELECT DISTINCT worker_version FROM runs_runevent "
                "WHERE run_id = %s AND step = %s AND worker_version <> ''",
                (run_id, step),
            )
        }
        missing += versions != {info.old_version}
    return missing


def retried() -> list[str]:
    """The workers' log lines of iterations claimed again or discarded by a lost fence."""
    pattern = re.compile(r"claimed again|fence lost")
    lines = []
    for log in sorted(DATA.glob("*.log")):
        lines += [
            f"{log.name}: {line.strip()}"
            for line in log.read_text(errors="replace").splitlines()
            if pattern.search(line)
        ]
    return lines


# --- main -------------------------------------------------------------------------------


def prepare() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    reset_probe()
    load_yaml_config()
    sql(TRUNCATE)
    sync_client().flushdb()  # the bench's own embedded Redis: no doorbell of an earlier run
    for log in [*DATA.glob("*.log"), DATA / "new-beat" / "beat.log"]:
        log.unlink(missing_ok=True)


def report(ids: dict[str, list[str]], info: Deploy, figures: dict[str, Any]) -> dict[str, int]:
    by_version = sql(
        "SELECT worker_version, count(DISTINCT (run_id, step)) FROM runs_runevent "
        "WHERE worker_version <> '' GROUP BY 1 ORDER BY 1"
    )
    after = one(
        "SELECT count(DISTINCT (run_id, step)) FROM runs_runevent WHERE worker_version <> '' AND created_at > %s",
        (info.cut_at,),
    )
    print(f"worker_version old {info.old_version!r}, new {info.new_version!r}", flush=True)
    print(f"iterations per worker_version: {dict(by_version)}; committed after the cut-over: {after}", flush=True)
    print("deploy phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in info.phases.items()), flush=True)
    print(
        f"deploy total (clone to last old worker gone): {sum(info.phases.values()):.1f} s; "
        f"migration: {info.migration or 'none applied'}",
        flush=True,
    )
    print(
        f"at SIGTERM: {info.live_at_stop} runs live, {len(info.leased_by_old)} iterations leased by old workers",
        flush=True,
    )
    for key, value in figures.items():
        print(f"{key}: {value}", flush=True)
    lines = retried()
    print(f"iterations retried: {len(lines)}", flush=True)
    for line in lines[:20]:
        print(f"  {line}", flush=True)
    found = violations(ids, info)
    for key, value in found.items():
        print(f"  {'OK ' if value == 0 else 'BAD'} {key}: {value}", flush=True)
    print(f"violations: {sum(found.values())}", flush=True)
    return found


def main() -> None:
    prepare()
    n = counts()
    print(
        f"rolling deploy: {RUNS} runs {n}, model calls {LATENCY_MS} ms, 2+2 workers x {CONCURRENCY} threads; "
        f"{os.cpu_count()} cores, {platform.platform()}; {len(waves()[1])} tool runs created during the deploy, "
        f"which starts after {DEPLOY_AT:.0%} of "
        f"{expected_iterations(n)} iterations",
        flush=True,
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    fleet, checkout = Fleet(), Path(tempfile.mkdtemp(prefix="loomcycle-next-"))
    load0, host0, t0 = os.getloadavg(), psutil.cpu_times(), time.monotonic()
    try:
        old = stack.start_workers(
            app,
            argv_app=["-A", "workers.celery:app"],
            queues="runs,maintenance",
            env=env,
            tag="old",
            count=2,
            concurrency=CONCURRENCY,
            logdir=DATA,
        )
        fleet.add(*old)
        old_beat = stack.start_beat(env, DATA)
        fleet.add(old_beat)
        first, second = waves()
        ids: dict[str, list[str]] = {kind: [] for kind in KINDS}
        create_all(first, ids)
        target = int(expected_iterations(n) * DEPLOY_AT)
        wait(lambda: committed_iterations() >= target, "the deploy point", DEADLINE_S)
        wait(
            lambda: parked(ids["ask"], RunStatus.AWAITING_INTERRUPT) and parked(ids["chat"], RunStatus.AWAITING_INPUT),
            "the asks and chats parked",
            DEADLINE_S,
        )
        info = deploy(fleet, checkout / "src", old, old_beat, ids, second)
        done = wait(lambda: all_ended(ids), "every run ended", DEADLINE_S)
        loads = os.getloadavg()
        figures = {
            "first run created to last run ended": f"{done - t0:.1f} s",
            "cut-over to last run ended": f"{done - info.started_at - sum(info.phases.values()):.1f} s",
            "load average (1/5/15 min) at start": "/".join(f"{x:.2f}" for x in load0),
            "load average (1/5/15 min) at end": "/".join(f"{x:.2f}" for x in loads),
            "host steal during the run": f"{stack.host_steal_pct(host0, psutil.cpu_times()):.1f} %",
        }
        found = report(ids, info, figures)
    finally:
        fleet.close()
        shutil.rmtree(checkout)
    if sum(found.values()):
        raise SystemExit(1)


def all_ended(ids: dict[str, list[str]]) -> bool:
    kids = Run.objects.filter(parent_id__in=ids["spawn"])
    return (
        all(Run.objects.filter(id__in=ids[k], status=KINDS[k].end).count() == len(ids[k]) for k in KINDS)
        and kids.count() == len(ids["spawn"])
        and not kids.exclude(status=RunStatus.COMPLETED).exists()
        and chats_done(ids["chat"])
    ) or Run.objects.filter(status__in=[RunStatus.FAILED, RunStatus.PAUSED]).exists()


def chats_done(chat_ids: list[str]) -> bool:
    """Every interactive run parked after its second turn (its step is past the answer)."""
    return Run.objects.filter(
        id__in=chat_ids, status=RunStatus.AWAITING_INPUT, step=KINDS["chat"].iterations
    ).count() == len(chat_ids)


if __name__ == "__main__":
    try:
        main()
    finally:
        connection.close()
        SERVICES.stop()
