"""pytest plugin (loaded with -p before pytest-django reads settings): with
no DATABASE_URL / REDIS_URL, start the embedded Postgres and Redis under
LOOMCYCLE_DATA_DIR/test and stop them when the session ends. Engine timings
are shortened so crash-recovery tests finish in seconds."""

from __future__ import annotations

import os
from pathlib import Path

from loomcycle_project.embedded import EmbeddedServices, ensure_services

_TEST_ENV = {
    "LOOMCYCLE_MOCK_LATENCY_MS": "0",
    "LOOMCYCLE_MOCK_LATENCY_JITTER_MS": "0",
    "LOOMCYCLE_MOCK_ALLOW_CRASH": "1",
    "LOOMCYCLE_LEASE_SECONDS": "3",
    "LOOMCYCLE_HEARTBEAT_SECONDS": "1",
    "LOOMCYCLE_SWEEP_SECONDS": "1",
    "LOOMCYCLE_REQUEUE_GRACE_SECONDS": "10",
    "LOOMCYCLE_FLOWER_ENABLED": "0",
    "LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS": "120000",  # as loomcycle's circuit load test runs it
    # Every request checks the auth epoch: a test's token writes (and the
    # teardown bump after its flush) reach the web process at once.
    "LOOMCYCLE_AUTH_EPOCH_CHECK_MS": "0",
    # One key for every process of the suite, as a deployment has (the runs' sealed credentials open anywhere).
    "DJANGO_SECRET_KEY": "test-suite-secret-key-shared-by-the-web-and-the-workers",
    # tests/tools runs Bash in real workers (its refusal when off is tested in-process).
    "LOOMCYCLE_BASH_ENABLED": "1",
    # The run caps are off for the suite: a test's flush deletes runs it left parked while their
    # Redis slots live on (only the beat's reconcile frees them, and many tests run without it), so
    # across a session the shipped defaults (64 per user, 256 per tenant) would refuse unrelated
    # tests. The tests of the caps set them (tests/gateway/test_fairness.py, tests/runs/test_run_quotas.py).
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "0",
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": "0",
    # The suite's tenant schedules fire every minute; tests/substrate/test_quotas.py sets the minimum.
    "LOOMCYCLE_TENANT_SCHEDULE_MIN_PERIOD_SECONDS": "60",
}

# Set by the first pytest process of a session (the only one, or pytest-xdist's controller) to the
# suite's data dir; an xdist worker inherits the controller's environment and finds it there.
_ROOT_VAR = "LOOMCYCLE_TEST_DATA_ROOT"
# What the first process filled in itself (never what the caller set): an xdist worker drops these
# and fills them again for its own data dir, so it starts its own Postgres and Redis.
_OWNED_VAR = "LOOMCYCLE_TEST_OWNED_ENV"
_PER_PROCESS = ("DATABASE_URL", "REDIS_URL", "LOOMCYCLE_VOLUMES_ROOT", "LOOMCYCLE_EMBEDDED_POSTGRES")


def _data_dir() -> Path:
    """This process's data dir. The first process's is LOOMCYCLE_DATA_DIR/test; each xdist worker's
    is a subdirectory named after it (`test/gw0`), with its own embedded Postgres and Redis, logs and
    volumes, so workers share no server, queue, lock or file (docs/architecture.md, the test suite)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    root = os.environ.get(_ROOT_VAR)
    if worker and root:
        owned = set(filter(None, os.environ.get(_OWNED_VAR, "").split(",")))
        shared = {"DATABASE_URL", "REDIS_URL"} - owned
        if shared:
            raise RuntimeError(
                f"pytest-xdist runs need the embedded services; {', '.join(sorted(shared))} set by the caller "
                "would be shared by every worker (run without -n)"
            )
        for var in owned:
            os.environ.pop(var, None)
        return Path(root) / worker
    base = Path(__file__).resolve().parent.parent
    data = Path(os.environ.get("LOOMCYCLE_DATA_DIR", str(base / ".loomcycle"))) / "test"
    os.environ[_ROOT_VAR] = str(data)
    os.environ[_OWNED_VAR] = ",".join(var for var in _PER_PROCESS if not os.environ.get(var))
    return data


for _key, _value in _TEST_ENV.items():
    os.environ.setdefault(_key, _value)
_data = _data_dir()
os.environ["LOOMCYCLE_DATA_DIR"] = str(_data)
os.environ.setdefault("LOOMCYCLE_VOLUMES_ROOT", str(_data / "volumes"))  # dynamic and ephemeral volumes on
Path(os.environ["LOOMCYCLE_VOLUMES_ROOT"]).mkdir(parents=True, exist_ok=True)  # "mounted" (create refuses without)
_base = Path(__file__).resolve().parent.parent
_configs = [_base / "loomcycle.yaml", _base / "bench" / "circuit.yaml", _base / "tests" / "loomcycle.test.yaml"]
os.environ.setdefault("LOOMCYCLE_CONFIG_FILES", ",".join(str(p) for p in _configs))
_SERVICES: EmbeddedServices = ensure_services(_data)


def _commit_without_waiting_for_the_disk(services: EmbeddedServices) -> None:
    """The suite's own embedded Postgres (never a DATABASE_URL the caller set) runs with
    synchronous_commit off: a commit returns before its WAL reaches the disk (~1 ms instead
    of ~5 on this host). Only an OS crash can lose a test database's last commits; no crash
    corrupts a file (unlike fsync off). The setting is the test data dir's own (postgresql.auto.conf)."""
    if services.database_url is None:
        return
    import psycopg

    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("SELECT pg_reload_conf()")


_commit_without_waiting_for_the_disk(_SERVICES)


def pytest_unconfigure(config: object) -> None:
    from apps.runs.live import LIVE

    LIVE.stop()  # its Redis subscription must not complain about the shutdown below
    _SERVICES.stop()
