"""compose/ is written and linted here, not run (no Docker engine on these machines)."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_declares_every_process_on_real_postgres_and_redis() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat", "flower"} <= set(services)
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")
    env = services["web"]["environment"]
    assert env["DATABASE_URL"].startswith("postgres://") and env["REDIS_URL"].startswith("redis://")
    assert "LOOMCYCLE_AUTH_TOKEN" in env  # published beyond loopback: a token is required
    # Nothing is generated on external servers: every container shares these.
    assert {"DJANGO_SECRET_KEY", "LOOMCYCLE_OPERATOR_TOKEN_PEPPER"} <= set(env)
    flower_env = services["flower"]["environment"]
    assert "FLOWER_BASIC_AUTH" in flower_env  # it listens on 0.0.0.0 in the network
    assert set(env) <= set(flower_env)  # and keeps every shared variable
    assert services["migrate"]["command"] == ["python", "manage.py", "boot"]
    assert services["worker"]["init"] is True  # the worker runs Bash: PID 1 must reap orphans
    for name in ("worker", "beat", "flower"):
        command = services[name]["command"]
        module, _, attr = command[command.index("-A") + 1].partition(":")
        assert hasattr(importlib.import_module(module), attr)
    assert (ROOT / "compose" / "Dockerfile").read_text().startswith("# One image")
