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
}

for _key, _value in _TEST_ENV.items():
    os.environ.setdefault(_key, _value)
_base = Path(__file__).resolve().parent.parent
_data = Path(os.environ.get("LOOMCYCLE_DATA_DIR", str(_base / ".loomcycle"))) / "test"
os.environ["LOOMCYCLE_DATA_DIR"] = str(_data)
os.environ.setdefault("LOOMCYCLE_VOLUMES_ROOT", str(_data / "volumes"))  # dynamic and ephemeral volumes on
Path(os.environ["LOOMCYCLE_VOLUMES_ROOT"]).mkdir(parents=True, exist_ok=True)  # "mounted" (create refuses without)
_configs = [_base / "loomcycle.yaml", _base / "bench" / "circuit.yaml", _base / "tests" / "loomcycle.test.yaml"]
os.environ.setdefault("LOOMCYCLE_CONFIG_FILES", ",".join(str(p) for p in _configs))
_SERVICES: EmbeddedServices = ensure_services(_data)


def pytest_unconfigure(config: object) -> None:
    from apps.runs.live import LIVE

    LIVE.stop()  # its Redis subscription must not complain about the shutdown below
    _SERVICES.stop()
