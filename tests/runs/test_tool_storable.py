"""Tool output the store cannot take as it is (a NUL, a lone surrogate) is
made storable in one place (apps.runs.engine.toolrun) instead of failing the
step's commit: a real run whose HTTP tool reads a loopback body with NUL."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from apps.core.http import storable_text
from apps.runs import services
from apps.runs.models import RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_status
from tests.procs import WorkerPool


def test_storable_text_replaces_nul_and_escapes_lone_surrogates() -> None:
    assert storable_text("a\x00b\ud800c") == "a\ufffdb\\ud800c"
    plain = "plain ü"
    assert storable_text(plain) is plain


@pytest.mark.usefixtures("agents")
def test_a_tool_result_with_nul_does_not_fail_the_run(stack: WorkerPool, httpserver: HTTPServer, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(  # as the workers' stack_env: the run may reach localhost
        settings.LOOMCYCLE, http_host_allowlist=("localhost",), http_private_host_allowlist=("localhost",)
    )
    httpserver.expect_request("/nul").respond_with_data(b"before\x00after", content_type="text/plain")
    url = f"http://localhost:{httpserver.port}/nul"
    steps = [{"tool": "HTTP", "input": {"url": url}}, {"text": "read it"}]
    prompt = f"Fetch. MOCK_SCRIPT: {json.dumps(steps)}"
    run = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="fetcher", segments=[Segment(text=prompt)])
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    result = RunEvent.objects.get(run_id=run.id, type="tool_result").payload
    assert not result["is_error"], result["text"]
    assert "before\ufffdafter" in result["text"]
    stored = json.dumps(list(TranscriptEntry.objects.filter(run_id=run.id).values_list("content", flat=True)))
    assert "before\\ufffdafter" in stored
