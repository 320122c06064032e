"""/v1/openapi.json is enough for a generated client: openapi-python-client (a kept generator,
requirements/dev.txt) generates a package from the document the running web serves; the package
imports, creates a run and reads it back with typed models, and a refusal parses as the Error schema."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from apps.substrate import tokens
from tests.conftest import wait_for
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")
PACKAGE = "lc_generated"


@pytest.fixture
def generated(web: str, tmp_path: Path) -> Iterator[ModuleType]:
    spec = tmp_path / "openapi.json"
    spec.write_bytes(httpx.get(web + "/v1/openapi.json", timeout=30).raise_for_status().content)
    bindir = str(Path(sys.executable).parent)  # its post-generation hook runs ruff from PATH
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    # `-m`, not the console script: the script's shebang names the venv it was installed from
    argv = [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec), "--meta", "none"]
    done = subprocess.run(
        [*argv, "--output-path", str(tmp_path / PACKAGE)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr  # every operation generated
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _op(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.runs.{name}")


def test_a_generated_client_creates_a_run_and_reads_it_back(generated: ModuleType, web: str, stack: WorkerPool) -> None:
    models = importlib.import_module(f"{PACKAGE}.models")
    token: str = tokens.token_create(name="generated", tenant_id="ops")["token"]
    client = generated.AuthenticatedClient(base_url=web, token=token, raise_on_unexpected_status=True)
    body = models.RunsCreateRunCreateIn.from_dict({"agent": "echo", "prompt": "hi", "background": True})
    created = _op("runs_create").sync(client=client, body=body)
    assert isinstance(created, models.RunCreatedOut) and created.run_id.startswith("r_")

    def finished() -> Any:
        run = _op("runs_get").sync(client=client, run_id=created.run_id)
        return run if run.state == "completed" else None

    run = wait_for(finished, timeout=60)
    assert isinstance(run, models.RunOut)
    assert (run.agent_id, run.session_id, run.agent) == (created.agent_id, created.session_id, "echo")
    assert run.last_seq > 0 and run.usage.additional_properties  # the typed model keeps the free-form usage
    listed = _op("runs_list").sync(client=client, status="all")
    assert created.run_id in [r.run_id for r in listed.runs]

    missing = _op("runs_get").sync(client=client, run_id="r_0000000000000000")
    assert isinstance(missing, models.Error) and missing.code == "not_found"
