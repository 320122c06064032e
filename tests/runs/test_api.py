"""The runs HTTP/SSE/WebSocket surface against a real Daphne, workers and Redis."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from apps.core.errors import Forbidden, Unauthorized
from apps.runs.models import Run, RunEvent, RunStatus
from apps.substrate.auth import authenticate
from tests.conftest import run_row, wait_for, wait_status
from tests.factories.runs import sse_frames
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "stack")


def persisted_seqs(run_id: str) -> list[int]:
    return list(
        RunEvent.objects.filter(run_id=run_id)
        .exclude(type="system_prompt")
        .order_by("seq")
        .values_list("seq", flat=True)
    )


def test_post_runs_streams_the_spec_frame_order(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/runs", json={"agent": "echo", "prompt": "hi"}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(resp.iter_lines())
    assert [f["event"] for f in frames] == ["session", "agent", "started", "text", "usage", "done"]
    assert frames[0]["data"]["text"].startswith("s_")
    agent = frames[1]["data"]
    assert agent["run_id"].startswith("r_") and agent["agent_id"].startswith("a_")
    assert frames[3]["data"] == {"type": "text", "text": "ok"}
    assert frames[5]["data"]["stop_reason"] == "end_turn"
    assert [f.get("id") for f in frames[2:]] == [3, 4, 5, 6]  # id: <seq> on every persisted frame


def test_a_request_field_not_acted_on_is_announced_on_the_stream_before_the_output(http: httpx.Client) -> None:
    """capability_inert (apps.runs.inert) is among a run's first events, yet the caller's own
    stream shows it: the stream starts at the first announcement, not after the first events."""
    body = {"agent": "echo", "prompt": "hi", "run_timeout_seconds": 30}  # web_search_filter is acted on (issue 40)
    with http.stream("POST", "/v1/runs", json=body) as resp:
        assert resp.status_code == 200
        frames = sse_frames(resp.iter_lines())
    kinds = [f["event"] for f in frames]
    assert kinds == ["session", "agent", "capability_inert", "started", "text", "usage", "done"]
    announced = frames[2]["data"]["capability_inert"]
    assert (announced["gate"], announced["tool"], announced["source"]) == ("run_timeout_seconds", "", "request")


def test_curl_default_form_content_type_is_read_as_json(http: httpx.Client) -> None:
    body = '{"agent":"echo","prompt":"hi","background":true}'
    resp = http.post("/v1/runs", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 202


def test_background_run_returns_202_and_is_readable_by_id(http: httpx.Client) -> None:
    resp = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True, "user_id": "u1"})
    assert resp.status_code == 202
    ids = resp.json()
    wait_status(ids["run_id"], RunStatus.COMPLETED)
    by_agent = http.get(f"/v1/agents/{ids['agent_id']}").json()
    assert by_agent["status"] == "completed" and by_agent["run_id"] == ids["run_id"]
    assert by_agent["content_sha256"].startswith("sha256:") and by_agent["usage"]["provider"] == "mock"
    assert http.get(f"/v1/runs/{ids['run_id']}").json()["agent_id"] == ids["agent_id"]
    listed = http.get("/v1/users/u1/agents", params={"status": "all"}).json()["agents"]
    assert [a["run_id"] for a in listed] == [ids["run_id"]]
    assert http.get("/v1/users/u1/agents").json()["agents"] == []  # default: live runs only


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b'{"prompt":"hi"}', {"Content-Type": "application/json"}, 400, "invalid_body"),
        (b'{"agent":"nope","prompt":"hi"}', {"Content-Type": "application/json"}, 400, "unknown_agent"),
        (b'{"agent":"echo"}', {"Content-Type": "application/json"}, 400, "invalid_body"),
        (
            b'{"agent":"echo","prompt":"hi","agent_id":"bad id!"}',
            {"Content-Type": "application/json"},
            400,
            "invalid_body",
        ),
        (b'{"agent":"echo","prompt":"hi"}', {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (b'{"agent": "echo",', {"Content-Type": "application/json"}, 400, "invalid_json"),
        (b"[1, 2]", {"Content-Type": "application/json"}, 400, "invalid_body"),
    ],
)
def test_bad_run_requests_get_documented_4xx_and_leave_no_run(
    http: httpx.Client, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    resp = http.post("/v1/runs", content=body, headers=headers)
    assert resp.status_code == status, resp.text
    assert resp.json()["code"] == code and resp.json()["error"]
    assert Run.objects.count() == 0


def test_oversized_body_is_413_and_leaves_no_run(http: httpx.Client) -> None:
    big = b'{"agent":"echo","prompt":"' + b"x" * (16 * 1024 * 1024 + 10) + b'"}'
    resp = http.post("/v1/runs", content=big, headers={"Content-Type": "application/json"})
    assert resp.status_code == 413 and resp.json()["code"] == "payload_too_large"
    assert Run.objects.count() == 0


def test_agent_id_collision_is_409(http: httpx.Client) -> None:
    body = {"agent": "echo", "prompt": "hi", "agent_id": "mine", "background": True}
    assert http.post("/v1/runs", json=body).status_code == 202
    resp = http.post("/v1/runs", json=body)
    assert resp.status_code == 409 and resp.json()["code"] == "agent_id_in_use"
    unknown = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "session_id": "s_1"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "session_not_found"
    assert Run.objects.count() == 1


def test_unknown_ids_are_404_and_bad_ids_400(http: httpx.Client) -> None:
    assert http.get("/v1/agents/a_0000000000000000").json()["code"] == "unknown_agent_id"
    assert http.get("/v1/agents/a_0000000000000000").status_code == 404
    assert http.get("/v1/runs/r_missing/events").status_code == 404
    assert http.get("/v1/runs/bad%20id").status_code == 400
    assert http.post("/v1/agents/nobody/cancel").status_code == 404


def test_pause_state_resume_over_http(http: httpx.Client) -> None:
    assert http.get("/v1/_state").json() == {"state": "running", "paused_runs_count": 0}
    assert http.post("/v1/_pause", json={"timeout_ms": 1000}).json()["state"] == "paused"
    assert http.post("/v1/_pause").status_code == 409
    resp = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi"})
    assert resp.status_code == 503 and resp.json()["code"] == "runtime_paused"
    assert http.post("/v1/_resume").json()["state"] == "running"
    assert http.post("/v1/_resume").json()["code"] == "not_paused"


# A 4 s first iteration, then a second one that a pause parks (tests/gateway/test_mock_script.py).
SLOW_TWO_STEPS = {
    "agent": "scripted",
    "prompt": 'MOCK_SCRIPT: [{"tool": "Context", "input": {"op": "self"}, "sleep_ms": 4000}, {"text": "done"}]',
    "background": True,
}


def test_other_requests_are_answered_while_a_pause_waits_for_an_iteration(web: str) -> None:
    """The pause waits on the event loop (a DB check every 0.1 s), holding no server thread."""
    with httpx.Client(base_url=web, timeout=30) as client, httpx.Client(base_url=web, timeout=30) as other:
        run = client.post("/v1/runs", json=SLOW_TWO_STEPS).json()
        wait_for(lambda: RunEvent.objects.filter(run_id=run["run_id"], type="started").exists())
        with ThreadPoolExecutor(1) as pool:
            pausing = pool.submit(client.post, "/v1/_pause", json={"timeout_ms": 20_000})
            wait_for(lambda: other.get("/v1/_state").json()["state"] == "pausing")
            asked = time.monotonic()
            assert other.get("/v1/agents/a_0000000000000000").status_code == 404  # a sync view, answered now
            assert time.monotonic() - asked < 1.0
            assert not pausing.done()  # the 4 s model call is still in flight
            out = pausing.result(timeout=30).json()
        assert (out["state"], out["paused_runs_count"], out["warnings"]) == ("paused", 1, [])
        assert run_row(run["run_id"]).status == RunStatus.PAUSED
        assert other.post("/v1/_resume").json()["resumed_runs_count"] == 1
        wait_status(run["run_id"], RunStatus.COMPLETED, timeout=30)


def test_a_pause_whose_caller_hangs_up_still_pauses(web: str) -> None:
    with httpx.Client(base_url=web, timeout=30) as client:
        run = client.post("/v1/runs", json=SLOW_TWO_STEPS).json()
        wait_for(lambda: RunEvent.objects.filter(run_id=run["run_id"], type="started").exists())
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/_pause", json={"timeout_ms": 20_000}, timeout=httpx.Timeout(30, read=0.5))
        # The cancelled wait pauses at once, as a timeout does: the 4 s call is still in flight.
        assert wait_for(lambda: client.get("/v1/_state").json()["state"] == "paused", timeout=2)
        assert RunEvent.objects.filter(run_id=run["run_id"], type="tool_call").count() == 0
        wait_for(lambda: client.get("/v1/_state").json() == {"state": "paused", "paused_runs_count": 1}, timeout=30)
        assert client.post("/v1/_resume").json()["resumed_runs_count"] == 1
        wait_status(run["run_id"], RunStatus.COMPLETED, timeout=30)


def test_input_and_cancel_endpoints(http: httpx.Client) -> None:
    run = http.post("/v1/runs", json={"agent": "chat", "prompt": "hi", "background": True}).json()
    wait_status(run["run_id"], RunStatus.AWAITING_INPUT)
    assert http.post(f"/v1/runs/{run['run_id']}/input", json={"text": "  "}).status_code == 422
    assert http.post(f"/v1/runs/{run['run_id']}/input", json={"text": "more"}).json()["delivered"] is True
    wait_status(run["run_id"], RunStatus.AWAITING_INPUT)
    out = http.post(f"/v1/agents/{run['agent_id']}/cancel", json={"reason": "enough"}).json()
    assert out == {"cancelled": True, "agent_id": run["agent_id"], "cascaded": [], "reason": "enough"}
    assert http.post(f"/v1/runs/{run['run_id']}/input", json={"text": "late"}).status_code == 404


def test_sse_reattach_mid_run_is_gap_free_and_duplicate_free(http: httpx.Client) -> None:
    run = http.post("/v1/runs", json={"agent": "stepper", "prompt": "go", "background": True}).json()
    rid = run["run_id"]
    with http.stream("GET", f"/v1/runs/{rid}/stream", params={"from_seq": 0}) as resp:
        first = sse_frames(resp.iter_lines(), stop_after=4)
    assert Run.objects.get(id=rid).status != RunStatus.COMPLETED  # we really left mid-run
    last = max(f["id"] for f in first if "id" in f)
    with http.stream("GET", f"/v1/runs/{rid}/stream", headers={"Last-Event-ID": str(last)}) as resp:
        rest = sse_frames(resp.iter_lines())
    assert first[0]["event"] == "agent" and rest[0]["event"] == "agent"
    seen = [f["id"] for f in first + rest if "id" in f]
    assert seen == persisted_seqs(rid)  # every persisted event once, in order
    assert rest[-1]["event"] == "done"
    assert first[1]["event"] == "steer"  # the initial user_input, replayed as steer


def test_websocket_reattach_mid_run_matches_events(web: str, http: httpx.Client) -> None:
    run = http.post("/v1/runs", json={"agent": "stepper", "prompt": "go", "background": True}).json()
    rid = run["run_id"]
    url = web.replace("http://", "ws://") + f"/ws/runs/{rid}/"
    with connect(url + "?from_seq=0") as ws:
        first = [json.loads(ws.recv(timeout=10)) for _ in range(4)]
    last = first[-1]["seq"]
    rest = []
    with connect(url + f"?from_seq={last}") as ws:
        for raw in ws:
            rest.append(json.loads(raw))
    seen = [m["seq"] for m in first + rest if m["seq"] is not None]
    assert seen == persisted_seqs(rid)
    assert rest[-1]["event"] == "done"
    events = http.get(f"/v1/runs/{rid}/events").json()["events"]
    assert [e["seq"] for e in events if e["type"] != "system_prompt"] == seen


def test_websocket_unknown_run_closes_with_4404(web: str) -> None:
    url = web.replace("http://", "ws://") + "/ws/runs/r_0000000000000000/"
    with connect(url) as ws, pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=5)
    assert info.value.rcvd is not None and info.value.rcvd.code == 4404


def test_healthz_reports_postgres_redis_and_workers(http: httpx.Client, stack: WorkerPool) -> None:
    # A worker the pool just (re)started shows up once it has written its presence key.
    body = wait_for(lambda: (b := http.get("/healthz").json())["workers"]["count"] >= 1 and b)
    assert body["ok"] is True and body["postgres"]["pgvector"]
    assert body["redis"]["ok"] is True and body["workers"]["count"] >= 1


def test_auth_is_constant_time_bearer_or_loopback_open_mode(settings: Any) -> None:
    assert authenticate(None, "127.0.0.1").open_mode is True
    with pytest.raises(Forbidden):
        authenticate(None, "192.0.2.10")  # documentation address: never contacted
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token="s3cret-token")
    assert authenticate("s3cret-token", "192.0.2.10").subject == "legacy-token"
    with pytest.raises(Unauthorized):
        authenticate("wrong", "127.0.0.1")
    with pytest.raises(Unauthorized):
        authenticate(None, "127.0.0.1")


def test_openapi_docs_are_served(http: httpx.Client, stack: WorkerPool) -> None:
    spec = http.get("/v1/openapi.json").json()
    assert "/v1/runs" in spec["paths"] and "/v1/runs/{run_id}/stream" in spec["paths"]
    assert http.get("/v1/docs").status_code == 200


@pytest.mark.parametrize(
    ("agent", "flag", "expected"), [("slow", False, RunStatus.COMPLETED), ("very-slow", True, RunStatus.CANCELLED)]
)
def test_client_disconnect_cancels_only_when_asked(http: httpx.Client, agent: str, flag: bool, expected: str) -> None:
    body = {"agent": agent, "prompt": "hi", "cancel_on_disconnect": flag}
    with http.stream("POST", "/v1/runs", json=body) as resp:
        frames = sse_frames(resp.iter_lines(), stop_after=1)  # read up to `started`, then hang up
    run_id = frames[1]["data"]["run_id"]
    final = wait_status(run_id, RunStatus.COMPLETED, RunStatus.CANCELLED, timeout=30)
    assert final.status == expected
    if flag:
        assert final.stop_reason == "client disconnected"


def test_open_mode_refuses_foreign_host_names_against_dns_rebinding(http: httpx.Client) -> None:
    assert http.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
    assert http.get("/healthz", headers={"Host": "localhost"}).status_code == 200


def test_websocket_from_a_foreign_origin_is_refused(web: str, http: httpx.Client) -> None:
    run = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True}).json()
    url = web.replace("http://", "ws://") + f"/ws/runs/{run['run_id']}/"
    with pytest.raises(InvalidStatus) as info:
        connect(url, origin="http://evil.example")  # type: ignore[arg-type]
    assert info.value.response.status_code == 403
    with connect(url, origin=web) as ws:  # type: ignore[arg-type]
        assert json.loads(ws.recv(timeout=10))["event"] in {"steer", "started"}


def test_concurrent_creates_with_one_agent_id_give_one_run_and_409s(http: httpx.Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    body = {"agent": "echo", "prompt": "hi", "agent_id": "racer", "background": True}
    with ThreadPoolExecutor(6) as pool:
        codes = sorted(pool.map(lambda _: http.post("/v1/runs", json=body).status_code, range(6)))
    assert codes == [202, 409, 409, 409, 409, 409]
    assert Run.objects.filter(agent_id="racer").count() == 1


def test_listing_runs_reads_parents_without_a_query_per_run(django_assert_num_queries: Any) -> None:
    from apps.runs import selectors, services
    from apps.runs.presenters import agent_out
    from apps.runs.prompt import Segment
    from tests.conftest import ALICE

    def create(parent_id: str | None) -> Run:
        data = services.RunCreate(
            agent="very-slow", segments=[Segment(text="hi")], user_id="lister", parent_id=parent_id
        )
        return services.run_create(principal=ALICE, data=data)

    parent = create(None)
    children = [create(parent.id) for _ in range(3)]
    with django_assert_num_queries(1):
        out = [agent_out(r) for r in selectors.runs_for_user(tenant_id="", user_id="lister", status="all")]
    assert sorted(o["parent_agent_id"] or "" for o in out) == ["", *[parent.agent_id] * 3]
    for run in (parent, *children):
        services.run_cancel(principal=ALICE, agent_id=run.agent_id)
