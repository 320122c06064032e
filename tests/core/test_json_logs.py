"""LOOMCYCLE_LOG_FORMAT=json: one JSON object per line, with the run's ids where
the engine knows them (apps.core.logcontext, loomcycle_project.settings.logging_config).
A real worker process logs a real run; plain stays the default."""

from __future__ import annotations

import json
import logging
import logging.config
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from apps.core import logcontext
from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import RunStatus
from apps.runs.prompt import Segment
from loomcycle_project.settings import logging_config
from tests import procs
from tests.conftest import wait_for, wait_status
from tests.factories.observability import json_logging_worker, json_records

ACME = Principal(tenant_id="acme", subject="u", scopes=frozenset({"substrate:tenant"}))
SCRIPT = [{"tools": [{"tool": "Context", "input": {"op": "self"}}]}, {"text": "done"}]


@pytest.fixture
def json_worker(no_workers: None, stack_env: dict[str, str], logdir: Path) -> Iterator[Path]:
    """One JSON worker (the session's are stopped); yields its log file."""
    with json_logging_worker(stack_env, logdir / "json-worker.log") as log:
        yield log


def _wait_for_line(log: Path, *needles: str, timeout: float = 20.0) -> None:
    """Wait (bounded) until one line of `log` holds every needle."""
    wait_for(lambda: any(all(n in line for n in needles) for line in log.read_text().splitlines()), timeout=timeout)


@pytest.mark.usefixtures("agents")
def test_a_json_worker_logs_each_line_as_json_with_the_runs_ids(json_worker: Path) -> None:
    prompt = f"Test prompt. MOCK_SCRIPT: {json.dumps(SCRIPT)}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)])
    run = services.run_create(principal=ACME, data=data)
    wait_status(run.id, RunStatus.COMPLETED, timeout=60)
    _wait_for_line(json_worker, f'"run_id": "{run.id}"', "run finished")  # logged after the commit
    records = json_records(json_worker)
    assert all({"timestamp", "level", "logger", "message"} <= r.keys() for r in records)
    mine = [r for r in records if r.get("run_id") == run.id]
    assert {r["tenant"] for r in mine} == {"acme"}
    committed = [r for r in mine if r["message"].startswith("iteration committed")]
    assert [r["step"] for r in committed] == [0]
    finished = [r for r in mine if r["message"].startswith("run finished")]
    assert [(r["level"], r["step"], r["logger"]) for r in finished] == [("INFO", 1, "loomcycle.engine")]
    assert "completed" in finished[0]["message"]
    # Records made inside an iteration carry every id; those made outside carry none.
    assert all("tenant" in r and "step" in r for r in records if "run_id" in r)
    assert any("run_id" not in r for r in records)


@pytest.fixture
def json_handler() -> logging.Handler:
    """The console handler of logging_config("json"), configured on a logger of its own
    (the root logger, which pytest captures through, is left alone)."""
    config = logging_config("json", "INFO")
    del config["root"]
    config["loggers"] = {"lc.jsontest": {"handlers": ["console"], "level": "INFO", "propagate": False}}
    logging.config.dictConfig(config)
    return logging.getLogger("lc.jsontest").handlers[0]


def _format(handler: logging.Handler, msg: str, *args: Any) -> dict[str, Any]:
    record = logging.LogRecord("loomcycle.test", logging.WARNING, __file__, 1, msg, args, None)
    assert handler.filter(record)
    return json.loads(handler.format(record))  # type: ignore[no-any-return]


def test_the_context_and_the_trace_id_are_fields_only_while_known(json_handler: logging.Handler) -> None:
    assert _format(json_handler, "before").keys() == {"timestamp", "level", "logger", "message"}
    tracer = TracerProvider().get_tracer("test")
    with logcontext.bound(run_id="run-1", step=4), tracer.start_as_current_span("iteration") as span:
        logcontext.update(tenant="acme")
        line = _format(json_handler, "inside %s", "x")
    assert line["message"] == "inside x" and line["level"] == "WARNING"
    assert (line["run_id"], line["tenant"], line["step"]) == ("run-1", "acme", 4)
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert logcontext.current() == {}
    assert "run_id" not in _format(json_handler, "after")


def test_plain_is_the_default_and_an_unknown_format_stops_start_up() -> None:
    probe = "from django.conf import settings; print(settings.LOGGING['handlers']['console']['formatter'])"
    env = {k: v for k, v in os.environ.items() if k != "LOOMCYCLE_LOG_FORMAT"}
    env["DJANGO_SETTINGS_MODULE"] = "loomcycle_project.settings"
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=procs.ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["plain"]
    env["LOOMCYCLE_LOG_FORMAT"] = "xml"
    bad = subprocess.run([sys.executable, "-c", probe], env=env, cwd=procs.ROOT, capture_output=True, timeout=60)
    assert bad.returncode != 0
    assert "LOOMCYCLE_LOG_FORMAT must be one of plain, json (got 'xml')" in bad.stderr.decode()


def test_up_starts_its_celery_children_quiet_with_json_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's start-up banners are printed, not logged: `up` drops them when the logs are JSON."""
    from loomcycle_project import env as E
    from loomcycle_project.management.commands import up

    monkeypatch.setattr(E, "FLOWER_ENABLED", True)
    monkeypatch.setattr(E, "LOG_FORMAT", "json")
    celery = [c.argv for c in up.children("127.0.0.1", 8787) if "celery" in c.argv]
    assert len(celery) == E.WORKER_PROCESSES + 2 and all(argv[5] == "--quiet" for argv in celery)  # + beat, flower
    monkeypatch.setattr(E, "LOG_FORMAT", "plain")
    assert not any("--quiet" in c.argv for c in up.children("127.0.0.1", 8787))


def test_up_starts_workers_and_beat_at_the_configured_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    from loomcycle_project import env as E
    from loomcycle_project.management.commands import up

    monkeypatch.setattr(E, "LOG_LEVEL", "WARNING")
    celery = [c.argv for c in up.children("127.0.0.1", 8787) if c.name.startswith(("worker", "beat"))]
    assert len(celery) == E.WORKER_PROCESSES + 1
    assert all(argv[argv.index("--loglevel") + 1] == "WARNING" for argv in celery)
