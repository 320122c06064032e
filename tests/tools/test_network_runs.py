"""The network tools in real runs: mock-script agents on real workers fetch
loopback pages (the workers' LOOMCYCLE_HTTP_* come from tests/conftest.py
stack_env: hosts `localhost` and `127.0.0.1`, only `localhost` non-public),
refuse with reasons, and pass the host policy to sub-agents. A run's credentials
reach the server in HTTP headers and no worker log line or exported span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.tools.network import NO_HOSTS
from tests.conftest import ALICE, wait_for, wait_status
from tests.factories.observability import Receiver, Span, json_logging_worker, json_records, otel_env, otlp_receiver
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


def test_parallel_spawn_children_inherit_the_parents_hosts_never_wider(
    stack: WorkerPool, page: str, httpserver: HTTPServer
) -> None:
    child_script = json.dumps([{"tool": "HTTP", "input": {"url": page}}, {"text": "child done"}])
    spawns = [{"name": "fetcher", "prompt": f"Child {i}. MOCK_SCRIPT: {child_script}"} for i in range(2)]
    fan = {"op": "parallel_spawn", "spawns": spawns}
    parent = run([{"tool": "Agent", "input": fan}, {"text": "parent done"}], allowed_hosts=["127.0.0.1"])
    wait_status(parent.id, RunStatus.COMPLETED, timeout=30)
    children = list(Run.objects.filter(parent_id=parent.id))
    assert len(children) == 2
    for child in children:
        assert child.allowed_hosts == ["127.0.0.1"]  # not the operator's wider list
        [refused] = results(child.id)
        assert refused["error"] and "host 'localhost' is not in the allowed hosts (127.0.0.1)" in refused["text"]
    assert httpserver.log == []


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


# Per-run credentials (docs/tools.md): filled in at the HTTP boundary, never in a log line or a span.
API_KEY = "cred-api-7Hq2nM4pZx91-unseen"
BEARER = "bearer.Unseen-5Rk8Wq2Lm0Tz4Yc"


def _echo(request: Request) -> Response:
    """A service that echoes the credentials it was sent (body and a header), as an echo API would."""
    sent = {"caller": request.headers.get("X-Caller"), "key": request.headers.get("X-Api-Key")}
    return Response(json.dumps(sent), content_type="application/json", headers={"X-Echo-Key": str(sent["key"])})


@pytest.fixture
def observed(no_workers: None, stack_env: dict[str, str], logdir: Path) -> Iterator[tuple[Path, Receiver]]:
    """The only worker (the session's are stopped): JSON logs at DEBUG into its log file,
    spans exported to an OTLP receiver on loopback."""
    with (
        otlp_receiver() as receiver,
        json_logging_worker({**stack_env, **otel_env(receiver)}, logdir / "creds-worker.log", "creds") as log,
    ):
        yield log, receiver


def test_credentials_reach_the_server_but_no_log_line_or_span(
    observed: tuple[Path, Receiver], httpserver: HTTPServer
) -> None:
    log, receiver = observed
    httpserver.expect_request("/echo").respond_with_handler(_echo)
    url = f"http://localhost:{httpserver.port}/echo"
    # Not `Authorization: Bearer ...`: the prompt that carries the script is stored (and read
    # back by mock-script) redacted, and that pattern is masked in it (Tier B).
    headers = {"X-Caller": "caller ${run.user_bearer}", "X-Api-Key": "${run.credentials.api}"}
    done = run(
        [{"tool": "HTTP", "input": {"url": url, "headers": headers}}, {"text": "called"}],
        credentials={"user_bearer": BEARER, "api": API_KEY},
    )
    wait_status(done.id, RunStatus.COMPLETED, timeout=60)

    [(sent, _)] = httpserver.log  # the server received the values themselves
    assert (sent.headers["X-Caller"], sent.headers["X-Api-Key"]) == (f"caller {BEARER}", API_KEY)
    [echoed] = results(done.id)  # the echo went through the worker; the model read it masked
    assert not echoed["error"] and "X-Echo-Key: [redacted:run.credentials.api]" in echoed["text"]
    assert "caller [redacted:run.user_bearer]" in echoed["text"]
    assert API_KEY not in echoed["text"] and BEARER not in echoed["text"]

    wait_for(lambda: any(done.id in line and "run finished" in line for line in log.read_text().splitlines()))
    records = json_records(log)  # DEBUG and up, the run's own among them
    assert any(r["level"] == "DEBUG" for r in records)
    assert [r for r in records if r.get("run_id") == done.id and r["message"].startswith("iteration committed")]
    leaked = [line for line in log.read_text().splitlines() if API_KEY in line or BEARER in line]
    assert leaked == [], leaked[:3]

    def exported() -> list[Span]:
        spans = receiver.snapshot()
        mine = [s for s in spans if s.attributes.get("loomcycle.run_id") == done.id]
        tool = [s for s in mine if s.name == "execute_tool HTTP"]
        return spans if len([s for s in mine if s.name == "run.iterate"]) == 2 and tool else []

    spans = wait_for(exported, timeout=20)
    texts = [json.dumps([s.name, s.attributes, s.events], default=str) for s in spans]
    assert [t for t in texts if API_KEY in t or BEARER in t] == []
