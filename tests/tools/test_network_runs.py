"""The network tools in real runs: mock-script agents on real workers fetch
loopback pages (the workers' LOOMCYCLE_HTTP_* come from tests/conftest.py
stack_env: hosts `localhost` and `127.0.0.1`, only `localhost` non-public),
refuse with reasons, and pass the host policy to sub-agents."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer

from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.tools.network import NO_HOSTS
from tests.conftest import ALICE, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "net")

PAGE = "<html><head><title>Loopback</title></head><body><p>Fetched &amp; read.</p><script>x()</script></body></html>"


def run(steps: list[dict[str, Any]], **kw: Any) -> Run:
    prompt = f"Fetch. MOCK_SCRIPT: {json.dumps(steps)}"
    return services.run_create(
        principal=ALICE, data=services.RunCreate(agent="fetcher", segments=[Segment(text=prompt)], **kw)
    )


def results(run_id: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return [
        {"name": e.payload["tool_use"]["name"], "text": e.payload["text"], "error": e.payload["is_error"]} for e in rows
    ]


@pytest.fixture
def page(httpserver: HTTPServer) -> str:
    httpserver.expect_request("/page").respond_with_data(PAGE, content_type="text/html")
    return f"http://localhost:{httpserver.port}/page"


def test_a_run_fetches_a_loopback_page(stack: WorkerPool, page: str) -> None:
    calls = [{"tool": "WebFetch", "input": {"url": page}}, {"tool": "HTTP", "input": {"url": page}}]
    done = run([{"tools": calls}, {"text": "read it"}])
    wait_status(done.id, RunStatus.COMPLETED, timeout=30)
    fetched = {r["name"]: r for r in results(done.id)}
    assert fetched["WebFetch"] == {
        "name": "WebFetch",
        "text": f"HTTP GET {page} -> 200\n\nLoopback\n\nFetched & read.",
        "error": False,
    }
    assert fetched["HTTP"]["text"].startswith(f"HTTP GET {page} -> 200\n") and PAGE in fetched["HTTP"]["text"]
    assert Run.objects.get(id=done.id).allowed_hosts == ["localhost", "127.0.0.1"]


def test_allowed_hosts_empty_refuses_without_a_request(stack: WorkerPool, page: str, httpserver: HTTPServer) -> None:
    done = run([{"tool": "HTTP", "input": {"url": page}}, {"text": "refused"}], allowed_hosts=[])
    wait_status(done.id, RunStatus.COMPLETED, timeout=30)
    assert results(done.id) == [{"name": "HTTP", "text": NO_HOSTS.format(tool="HTTP"), "error": True}]
    assert httpserver.log == []


def test_a_loopback_address_is_refused_in_the_worker(stack: WorkerPool, httpserver: HTTPServer) -> None:
    url = f"http://127.0.0.1:{httpserver.port}/page"
    done = run([{"tool": "WebFetch", "input": {"url": url}}, {"text": "refused"}])
    wait_status(done.id, RunStatus.COMPLETED, timeout=30)
    [result] = results(done.id)
    assert result["error"] and "'127.0.0.1' resolves to 127.0.0.1, a loopback address" in result["text"]
    assert "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST" in result["text"]
    assert httpserver.log == []


def test_a_sub_agent_inherits_the_parents_hosts_never_wider(stack: WorkerPool, page: str) -> None:
    child_script = json.dumps([{"tool": "HTTP", "input": {"url": page}}, {"text": "child done"}])
    spawn = {"op": "spawn", "name": "fetcher", "prompt": f"Child. MOCK_SCRIPT: {child_script}"}
    parent = run([{"tool": "Agent", "input": spawn}, {"text": "parent done"}], allowed_hosts=["127.0.0.1"])
    wait_status(parent.id, RunStatus.COMPLETED, timeout=30)
    child = Run.objects.get(parent_id=parent.id)
    assert Run.objects.get(id=parent.id).allowed_hosts == ["127.0.0.1"]
    assert child.allowed_hosts == ["127.0.0.1"]  # not the operator's wider list
    [refused] = results(child.id)
    assert refused["error"] and "host 'localhost' is not in the allowed hosts (127.0.0.1)" in refused["text"]


def test_post_runs_takes_allowed_hosts_and_refuses_bad_entries(stack: WorkerPool, http: httpx.Client) -> None:
    body = {"agent": "fetcher", "prompt": 'MOCK_SCRIPT: [{"text": "hi"}]', "background": True}
    bad = http.post("/v1/runs", json={**body, "allowed_hosts": ["not a host"]})
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid_body"
    assert "'not a host' is not a host name" in bad.json()["error"]
    good = http.post("/v1/runs", json={**body, "allowed_hosts": ["localhost", "elsewhere.test"]})
    assert good.status_code == 202, good.text
    created = wait_status(good.json()["run_id"], RunStatus.COMPLETED, timeout=30)
    assert created.allowed_hosts == ["localhost"]
