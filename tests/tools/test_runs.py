"""Volumes and file tools through real runs (real workers, mock-script agents of
tests/loomcycle.test.yaml): bindings on the run row, ro and missing volumes,
sub-agents within their parent's volumes, ephemeral volumes purged at the end of
the top-level run, a Bash command killed by the run's cancel and holding no
database connection while it runs, and the VolumeDef admin routes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection

from apps.core.errors import ApplicationError, Conflict, Invalid
from apps.core.tools import VolumeBinding
from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.tools import services as volume_services
from apps.tools.files import read_execute, write_execute
from apps.tools.volumes import (
    _bind_one,
    _remove_tree,
    bindings_resolve,
    dynamic_path,
    static_volumes,
    volumes_root,
)
from loomcycle_project.db.base import application_name
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.tools import STATIC, ctx_for, gone, results, scripted
from tests.procs import WorkerPool

# --- binding resolution (in-process) ------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("work")
def test_bindings_resolve_static_narrowed_and_refused() -> None:
    (bound,) = bindings_resolve(tenant_id="", definition={"volumes": ["work:ro"]}, parent_id=None)
    assert (bound["name"], bound["mode"], bound["path"]) == ("work", "ro", str(STATIC / "work"))
    assert bindings_resolve(tenant_id="", definition={}, parent_id=None) == []
    cases = [
        (["nope"], "not configured"),
        ([{"name": "missing", "mode": "rw"}], "the volume is ro"),
        (["work", "work:ro"], "twice"),
        ([{"name": "work", "default": True}, {"name": "outside", "default": True}], "more than one"),
        ([{"name": "work", "size": 3}], "unknown binding field"),
        (["Bad Name"], "must match"),
    ]
    for volumes, message in cases:
        with pytest.raises(Invalid, match=message):
            bindings_resolve(tenant_id="", definition={"volumes": volumes}, parent_id=None)


@pytest.mark.django_db
def test_a_dynamic_volume_belongs_to_its_tenant() -> None:
    made = volume_services.volume_def_create(tenant_id="acme", name="reports", mode="rw")
    try:
        assert Path(made["path"]).is_dir() and made["path"].endswith("/tenants/acme/reports")
        again = volume_services.volume_def_create(tenant_id="acme", name="reports", mode="rw")
        assert again["deduplicated"] is True
        (bound,) = bindings_resolve(tenant_id="acme", definition={"volumes": ["reports"]}, parent_id=None)
        assert (bound["path"], bound["mode"]) == (made["path"], "rw")
        with pytest.raises(Invalid, match="not configured"):
            bindings_resolve(tenant_id="beta", definition={"volumes": ["reports"]}, parent_id=None)
    finally:
        volume_services.volume_def_purge(tenant_id="acme", name="reports")
    assert not Path(made["path"]).exists()


def test_a_dynamic_volume_path_cannot_leave_the_root() -> None:
    root = volumes_root()
    assert root is not None  # the suite sets LOOMCYCLE_VOLUMES_ROOT (pytest_plugin)
    assert dynamic_path("acme", "x") == root / "tenants" / "acme" / "x"
    assert dynamic_path("", "x") == root / "shared" / "x"
    for tenant, name in (("../etc", "x"), ("acme/..", "x"), ("acme", "../x"), ("acme", "X")):
        with pytest.raises(Invalid):
            dynamic_path(tenant, name)


# --- through real workers ------------------------------------------------------------------


@pytest.mark.usefixtures("agents")
def test_an_agent_writes_edits_greps_and_reads_back(stack: WorkerPool, work: Path) -> None:
    run = scripted(
        "files-rw",
        [
            {"tool": "Write", "input": {"path": "notes/summary.md", "content": "the page says hello\n"}},
            {"tool": "Edit", "input": {"path": "notes/summary.md", "old_string": "hello", "new_string": "goodbye"}},
            {"tool": "Grep", "input": {"pattern": "goodbye", "output_mode": "content"}},
            {"tool": "Glob", "input": {"pattern": "**/*.md"}},
            {"tool": "Read", "input": {"path": "notes/summary.md"}},
            {"tool": "Bash", "input": {"command": "wc -c < notes/summary.md"}},
            {"text": "done"},
        ],
    )
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.volumes == [
        {"name": "work", "path": str(work), "mode": "rw", "default": False, "ephemeral": False, "root_run_id": ""}
    ]
    assert results(run.id) == [
        ("Write", "wrote 20 bytes to notes/summary.md", False),
        ("Edit", "edited notes/summary.md (1 replacement)", False),
        ("Grep", "notes/summary.md:1:the page says goodbye", False),
        ("Glob", "notes/summary.md", False),
        ("Read", "the page says goodbye\n", False),
        ("Bash", "22\n", False),
    ]


@pytest.mark.usefixtures("agents", "work")
def test_ro_none_and_missing_volumes_refuse_with_a_reason(stack: WorkerPool) -> None:
    ro = scripted("files-ro", [{"tool": "Write", "input": {"path": "x", "content": "y"}}, {"text": "ok"}])
    none = scripted("files-none", [{"tool": "Read", "input": {"path": "x"}}, {"text": "ok"}])
    missing = scripted("files-missing", [{"tool": "Read", "input": {"path": "x"}}, {"text": "ok"}])
    for run in (ro, none, missing):
        wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    ((_, ro_text, ro_err),) = results(ro.id)
    assert ro_err and "read-only" in ro_text
    ((_, none_text, none_err),) = results(none.id)
    assert none_err and "not configured" in none_text
    ((_, missing_text, missing_err),) = results(missing.id)
    assert missing_err and "'missing'" in missing_text and str(STATIC / "missing") in missing_text


@pytest.mark.usefixtures("agents")
def test_an_unknown_volume_refuses_the_run_before_any_row() -> None:
    before = Run.objects.count()
    with pytest.raises(Invalid, match="binds volume 'nope', which is not configured") as refused:
        scripted("files-unknown", [{"text": "never"}])
    assert refused.value.code == "volume_not_found"
    assert Run.objects.count() == before


@pytest.mark.usefixtures("agents")
def test_a_sub_agent_gets_its_parents_volumes_never_wider_and_ephemeral_ones_are_purged(
    stack: WorkerPool, work: Path
) -> None:
    (STATIC / "outside").mkdir()
    child_script = [
        {"tool": "Read", "input": {"path": "from-parent.txt"}},
        {"tool": "Write", "input": {"path": "x.txt", "content": "no", "volume": "work"}},
        {"tool": "Write", "input": {"path": "x.txt", "content": "no", "volume": "outside"}},
        {"text": "child done"},
    ]
    run = scripted(
        "files-eph",
        [
            {"tool": "Write", "input": {"path": "from-parent.txt", "content": "scratch data"}},
            {
                "tool": "Agent",
                "input": {"name": "files-eph-child", "prompt": f"MOCK_SCRIPT: {json.dumps(child_script)}"},
            },
            {"tool": "Bash", "input": {"command": "pwd"}},
            {"text": "parent done"},
        ],
    )
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED, done.error
    child = Run.objects.get(parent_id=run.id)
    assert {v["name"]: (v["mode"], v["ephemeral"], v["root_run_id"]) for v in child.volumes} == {
        "scratch": ("rw", True, run.id),
        "work": ("ro", False, ""),  # the parent has it ro: the child's rw narrows to that
    }  # `outside` is not the parent's: dropped
    assert [(t, e) for _, t, e in results(child.id)] == [
        ("scratch data", False),
        ("volume 'work' is read-only for this run", True),
        ("volume 'outside' is not bound to this run (bound: scratch, work)", True),
    ]
    scratch = Path(settings.LOOMCYCLE.volumes_root) / "ephemeral" / run.id
    bash_pwd = results(run.id)[-1][1]
    assert bash_pwd.strip() == str(scratch / "scratch")
    wait_for(lambda: not scratch.exists(), timeout=10)  # purged when the top-level run ended
    assert not (STATIC / "outside" / "x.txt").exists() and not (work / "x.txt").exists()


@pytest.fixture
def unsandboxed(workers: WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[WorkerPool]:
    """Workers that run Bash unsandboxed (LOOMCYCLE_BASH_UNSANDBOXED=1), for the tests that look a
    command's `$$` or `$PPID` up on the host: a sandboxed command has its own PID namespace (its pids
    mean nothing outside). The session's workers stop meanwhile, so these take every run; they
    take no maintenance task (beat's sweeps wait for the session's workers), so a worker's
    Postgres sessions are its iterations' alone. test_sandbox_runs.py covers the sandboxed
    command's cancel."""
    workers.stop()
    env = {**stack_env, "LOOMCYCLE_BASH_UNSANDBOXED": "1"}
    pool = WorkerPool(env, logdir, tag="unsandboxed", queues="runs")
    pool.ensure()
    try:
        yield pool
    finally:
        pool.stop()


@pytest.mark.usefixtures("agents")
def test_cancel_kills_a_running_bash_within_a_second(unsandboxed: WorkerPool, work: Path) -> None:
    run = scripted("files-rw", [{"tool": "Bash", "input": {"command": "echo $$ > sh.pid; exec sleep 120"}}])
    pid = int(wait_for(lambda: (work / "sh.pid").exists() and (work / "sh.pid").read_text().strip(), timeout=30))
    with connection.cursor() as cur:  # measured on Postgres's clock, which stamps completed_at too
        cur.execute("SELECT now()")
        (asked,) = cur.fetchone()
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="test cancel")
    done = wait_status(run.id, RunStatus.CANCELLED, timeout=10)
    took = (done.completed_at - asked).total_seconds()
    assert took < 1.0, f"cancel took {took:.2f} s"
    gone(pid)


def _worker_sessions(pid: int, since: datetime) -> list[tuple[str, bool, str]]:
    """The Postgres sessions of worker process `pid` (application_name `loomcycle:<pid>`):
    (state, whether its transaction or statement began before `since`, its query)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT state, coalesce(xact_start, query_start) < %s, query FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [since, application_name(pid)],
        )
        return [(state, bool(before), query) for state, before, query in cur.fetchall()]


@pytest.mark.usefixtures("agents")
def test_a_running_bash_command_holds_no_database_connection(unsandboxed: WorkerPool, work: Path) -> None:
    """docs/tools.md: the call holds no DB connection while the command runs. The worker's
    pool may keep a connection open, idle; none is in use (active, or idle in a transaction)."""
    (work / "hold").touch()  # the command waits while it exists
    command = "echo $PPID > worker.pid; while [ -e hold ]; do sleep 0.05; done; echo released"
    run = scripted("files-rw", [{"tool": "Bash", "input": {"command": command}}, {"text": "done"}])
    pid = int(wait_for(lambda: (work / "worker.pid").exists() and (work / "worker.pid").read_text().strip(), 30))
    assert pid in unsandboxed.pids()  # the shell's parent: the worker process running the iteration
    with connection.cursor() as cur:  # on Postgres's clock, as pg_stat_activity's times
        cur.execute("SELECT now()")
        (started,) = cur.fetchone()

    def nothing_in_use() -> bool:
        sessions = _worker_sessions(pid, started)
        assert sessions, "no session named after the worker"  # its pool keeps one: the name matches
        held = [s for s in sessions if s[0] != "idle" and s[1]]
        assert held == [], f"busy since before the command started: {held}"
        return all(state == "idle" for state, _, _ in sessions)  # a beat task's brief query: look again

    wait_for(nothing_in_use, timeout=10)
    assert (work / "hold").exists() and run_row(run.id).status == RunStatus.RUNNING  # still in the command
    (work / "hold").unlink()
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert results(run.id) == [("Bash", "released\n", False)]


# --- admin routes --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_volumedef_routes_are_tenant_scoped(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    alice, charlie = people["alice"], people["charlie"]
    made = http.post("/v1/_volumedef", json={"op": "create", "name": "inbox"}, headers=alice)
    assert made.status_code == 200, made.text
    assert (made.json()["name"], made.json()["mode"], made.json()["tenant_id"]) == ("inbox", "rw", "acme")
    listed = http.post("/v1/_volumedef", json={"op": "list"}, headers=alice).json()
    assert [v["name"] for v in listed["volumes"]] == ["inbox"]
    assert http.post("/v1/_volumedef", json={"op": "list"}, headers=charlie).json() == {"volumes": []}
    hidden = http.post("/v1/_volumedef", json={"op": "get", "name": "inbox"}, headers=charlie)
    assert (hidden.status_code, hidden.json()["code"]) == (404, "volume_not_found")
    bad = http.post("/v1/_volumedef", json={"op": "create", "name": "Bad Name"}, headers=alice)
    assert (bad.status_code, bad.json()["code"]) == (400, "volume_name_invalid")
    static = http.post("/v1/_volumedef", json={"op": "create", "name": "work"}, headers=alice)
    assert (static.status_code, static.json()["code"]) == (409, "volume_static")
    unknown = http.post("/v1/_volumedef", json={"op": "mount"}, headers=alice)
    assert (unknown.status_code, unknown.json()["code"]) == (400, "volume_op_invalid")
    path = Path(made.json()["path"])
    (path / "keep.txt").write_text("kept")
    assert http.post("/v1/_volumedef", json={"op": "delete", "name": "inbox"}, headers=alice).json()["purged"] is False
    assert (path / "keep.txt").exists()
    http.post("/v1/_volumedef", json={"op": "create", "name": "inbox"}, headers=alice)
    assert http.post("/v1/_volumedef", json={"op": "purge", "name": "inbox"}, headers=alice).json()["purged"] is True
    assert not path.exists()


@pytest.mark.usefixtures("agents", "work")
def test_cancelling_a_parked_run_purges_its_ephemeral_volumes(stack: WorkerPool) -> None:
    steps = [{"tool": "Write", "input": {"path": "f.txt", "content": "x"}}, {"text": "waiting for you"}]
    run = scripted("files-eph", steps, interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)  # parked: no worker holds it
    scratch = Path(settings.LOOMCYCLE.volumes_root) / "ephemeral" / run.id
    assert (scratch / "scratch" / "f.txt").read_text() == "x"
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="done with it")
    assert wait_status(run.id, RunStatus.CANCELLED).stop_reason == "done with it"
    wait_for(lambda: not scratch.exists(), timeout=10)


def test_without_a_volumes_root_there_are_no_dynamic_or_ephemeral_volumes(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, volumes_root="")
    with pytest.raises(Conflict, match="not configured") as refused:
        volume_services.volume_def_create(tenant_id="acme", name="reports")
    assert refused.value.code == "volumes_not_configured"
    ctx = ctx_for(VolumeBinding(name="scratch", path="", mode="rw", ephemeral=True))
    result = read_execute(ctx, {"path": "a.txt"})
    assert result.is_error and "volume 'scratch': dynamic and ephemeral volumes are not configured" in result.text


@pytest.mark.django_db
def test_the_dynamic_root_is_never_bindable(tmp_path: Path) -> None:
    pool = {"path": str(tmp_path / "pool"), "mode": "rw", "dynamic_root": True}
    config = {"volumes": {"pool": pool, "docs": {"path": str(tmp_path / "docs")}}}
    assert set(static_volumes(config)) == {"docs"}
    assert volumes_root(config) == tmp_path / "pool"
    with pytest.raises(Invalid, match="not configured"):
        _bind_one("", {"name": "pool"}, static_volumes(config))


@pytest.mark.parametrize("path", ["pool", "pool/tenants/acme", "."])
def test_a_static_volume_overlapping_the_volumes_root_stops_the_boot(tmp_path: Path, path: str) -> None:
    pool = {"path": str(tmp_path / "pool"), "mode": "ro", "dynamic_root": True}
    config = {"volumes": {"pool": pool, "sneaky": {"path": str(tmp_path / path), "mode": "rw"}}}
    with pytest.raises(Invalid, match="overlaps the volumes root") as caught:
        static_volumes(config)
    assert caught.value.code == "config_invalid"


def test_a_static_volume_overlapping_lc_volumes_root_stops_the_boot() -> None:
    root = volumes_root()
    assert root is not None
    with pytest.raises(Invalid, match="overlaps the volumes root"):
        static_volumes({"volumes": {"sneaky": {"path": str(root / "ephemeral"), "mode": "ro"}}})


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("data", "contains the data directory"),
        ("data/..", "contains the data directory"),  # the checkout's .loomcycle, or its parent
        ("/", "contains the data directory"),
        ("data/pg", "inside the runtime's own"),
        ("data/secrets.json", "inside the runtime's own"),
        ("data/redis/x", "inside the runtime's own"),
        ("checkout", "contains the (data directory|checkout)"),  # the data directory is under it here
        ("checkout/apps", "inside the checkout"),
    ],
)
def test_a_static_volume_reaching_the_runtimes_own_places_stops_the_boot(settings: Any, where: str, match: str) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, volumes_root="")  # this check alone
    data, checkout = Path(settings.LOOMCYCLE.data_dir), Path(settings.BASE_DIR)
    path = where.replace("checkout", str(checkout)).replace("data", str(data))
    with pytest.raises(Invalid, match=match) as caught:
        static_volumes({"volumes": {"sneaky": {"path": path, "mode": "ro"}}})
    assert caught.value.code == "config_invalid"
    own = str(data / "volumes-static" / "mine")  # a folder of its own in the data directory is fine
    assert set(static_volumes({"volumes": {"mine": {"path": own, "mode": "rw"}}})) == {"mine"}


@pytest.mark.django_db
def test_a_static_volume_with_a_tenant_list_binds_for_those_tenants_only(tmp_path: Path) -> None:
    config = {"volumes": {"books": {"path": str(tmp_path / "books"), "mode": "ro", "tenants": ["acme"]}}}
    statics = static_volumes(config)
    assert _bind_one("acme", {"name": "books"}, statics).path == str(tmp_path / "books")
    assert _bind_one("", {"name": "books"}, statics).path == str(tmp_path / "books")  # the operator's own runs
    with pytest.raises(Invalid, match="not configured"):  # as unknown to beta as a missing volume
        _bind_one("beta", {"name": "books"}, statics)
    with pytest.raises(Invalid, match="tenants must be a list of tenant ids"):
        static_volumes({"volumes": {"bad": {"path": str(tmp_path), "tenants": "acme"}}})


@pytest.mark.usefixtures("agents", "work")
def test_a_late_call_never_re_creates_a_purged_ephemeral_volume(stack: WorkerPool) -> None:
    run = scripted("files-eph", [{"text": "waiting for you"}], interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    scratch = Path(settings.LOOMCYCLE.volumes_root) / "ephemeral" / run.id
    # a sub-agent's tool call: the binding names the top-level run
    child = ctx_for(VolumeBinding(name="scratch", path="", mode="rw", ephemeral=True, root_run_id=run.id))
    assert not write_execute(child, {"path": "a.txt", "content": "live"}).is_error
    assert (scratch / "scratch" / "a.txt").read_text() == "live"
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="done")
    wait_status(run.id, RunStatus.CANCELLED)
    wait_for(lambda: not scratch.exists(), timeout=10)
    late = write_execute(child, {"path": "b.txt", "content": "late"})
    assert late.is_error and "the run's ephemeral volume is gone" in late.text
    assert not scratch.exists()


def test_a_purge_retries_when_a_writer_adds_an_entry_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "eph"
    (target / "scratch").mkdir(parents=True)
    real_rmtree = shutil.rmtree
    calls: list[int] = []

    def racing_rmtree(path: Any, *args: Any, **kw: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(39, "Directory not empty", str(path))  # a late write landed mid-removal
        real_rmtree(path, *args, **kw)

    monkeypatch.setattr(shutil, "rmtree", racing_rmtree)
    _remove_tree(target, "test")
    assert len(calls) == 2 and not target.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("mode", [{}, [], 0, "", "RW"])
def test_a_volumedef_mode_must_be_ro_or_rw(mode: Any) -> None:
    with pytest.raises(Invalid, match="mode must be ro or rw") as refused:
        volume_services.volume_def_create(tenant_id="acme", name="modes", mode=mode)
    assert refused.value.code == "volume_mode_invalid"


@pytest.mark.django_db
def test_a_host_without_the_volumes_root_refuses_and_creates_nothing(settings: Any, tmp_path: Path) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, volumes_root=str(tmp_path / "not-mounted"))
    with pytest.raises(ApplicationError, match="does not exist on this host") as refused:
        volume_services.volume_def_create(tenant_id="acme", name="reports")
    assert (refused.value.status, refused.value.code) == (503, "volumes_root_missing")
    assert not (tmp_path / "not-mounted").exists()


@pytest.mark.django_db
def test_a_directory_that_cannot_be_made_is_a_503_with_a_code(settings: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "tenants").mkdir(parents=True)
    (root / "tenants" / "acme").write_text("a file where the tenant directory should be")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, volumes_root=str(root))
    with pytest.raises(ApplicationError, match="cannot make the volume's directory") as refused:
        volume_services.volume_def_create(tenant_id="acme", name="reports")
    assert (refused.value.status, refused.value.code) == (503, "volume_dir_failed")
