"""The bundled example of issue 20 (`web-notes` in loomcycle.yaml): on a real worker
it fetches a loopback page, writes a summary into its per-run volume and reads it
back; under the managed-sandbox settings each of those tools refuses with a reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from pytest_httpserver import HTTPServer

from apps.core import toolregistry as registry
from apps.core.tools import VolumeBinding
from apps.runs import services
from apps.runs.models import RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.tools.posture import Posture, posture
from apps.tools.volumes import bindings_resolve
from loomcycle_project.bootstrap import load_yaml_config
from tests.conftest import ALICE, wait_for, wait_status
from tests.procs import WorkerPool
from tests.tools.conftest import tool_context

PAGE = "<html><head><title>Weather</title></head><body><p>Sunny &amp; warm.</p></body></html>"


@pytest.mark.usefixtures("agents", "net")
def test_web_notes_fetches_writes_and_reads_back(stack: WorkerPool, httpserver: HTTPServer) -> None:
    httpserver.expect_request("/weather").respond_with_data(PAGE, content_type="text/html")
    url = f"http://localhost:{httpserver.port}/weather"
    script = [
        {"tool": "WebFetch", "input": {"url": url}},
        {"tool": "Write", "input": {"path": "notes/summary.md", "content": "Weather: sunny and warm.\n"}},
        {"tool": "Read", "input": {"path": "notes/summary.md"}},
        {"text": "Saved and checked."},
    ]
    prompt = f"Summarise {url}. MOCK_SCRIPT: {json.dumps(script)}"
    run = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="web-notes", segments=[Segment(text=prompt)])
    )
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED, done.error
    rows = RunEvent.objects.filter(run_id=run.id, type="tool_result").order_by("seq")
    got = [(e.payload["tool_use"]["name"], e.payload["text"], e.payload["is_error"]) for e in rows]
    assert got == [
        ("WebFetch", f"HTTP GET {url} -> 200\n\nWeather\n\nSunny & warm.", False),
        ("Write", "wrote 25 bytes to notes/summary.md", False),
        ("Read", "Weather: sunny and warm.\n", False),
    ]
    scratch = Path(django_settings.LOOMCYCLE.volumes_root) / "ephemeral" / run.id
    wait_for(lambda: not scratch.exists(), timeout=10)  # the per-run volume went with the run


@pytest.mark.django_db
def test_the_managed_sandbox_refuses_each_step_with_a_reason(settings: Any) -> None:
    load_yaml_config()
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        http_host_allowlist=(),
        http_caller_authoritative=False,
        volumes_root="",
        bash_enabled=False,
        config_files=tuple(p for p in settings.LOOMCYCLE.config_files if p.endswith("/loomcycle.yaml")),
    )
    assert posture() is Posture.MANAGED_SANDBOX
    (binding,) = bindings_resolve(
        tenant_id="", definition={"volumes": [{"name": "notes", "ephemeral": True}]}, parent_id=None
    )
    ctx = dataclasses.replace(
        tool_context(allowed_hosts=()),
        tools=("WebFetch", "Write", "Read"),
        volumes=(VolumeBinding.from_dict(binding),),
    )
    calls = [
        ("WebFetch", {"url": "http://localhost/weather"}),
        ("Write", {"path": "notes/summary.md", "content": "x"}),
        ("Read", {"path": "notes/summary.md"}),
    ]
    results = {}
    for name, data in calls:
        tool = registry.get(name)
        assert tool is not None
        results[name] = tool.execute(ctx, data)
    assert all(r.is_error for r in results.values())
    assert results["WebFetch"].text.startswith("WebFetch is not configured")
    for name in ("Write", "Read"):
        assert "dynamic and ephemeral volumes are not configured on this runtime" in results[name].text
