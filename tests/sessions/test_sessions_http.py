"""The session routes over HTTP (SPEC 2.3, 4.5): `session_busy` under two
concurrent requests from two web processes, continuation streaming SSE like
POST /v1/runs, the transcript, tenant isolation and bad input. Real Daphne
processes, workers and Postgres; the agent is the mock-script `scripted`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from apps.runs.models import Run, RunStatus
from tests.conftest import daphne
from tests.factories.runs import sse_frames
from tests.factories.sessions import body, new_session

pytestmark = pytest.mark.usefixtures("agents", "stack")

PARK = [{"tool": "Channel", "input": {"op": "subscribe", "channel": "handoff", "wait_ms": 120_000}}]


@pytest.fixture(scope="module")
def second_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    with daphne(stack_env, logdir, "daphne-sessions", start_timeout=120) as base:  # a loaded host starts slowly
        yield base


def test_two_web_processes_admit_one_of_two_concurrent_messages(http: httpx.Client, second_web: str) -> None:
    session = new_session(http)
    barrier = threading.Barrier(2)
    answers: list[httpx.Response] = []

    def send(base: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            barrier.wait()
            answers.append(client.post(f"/v1/sessions/{session}/messages", json=body("P1", PARK, background=True)))

    threads = [threading.Thread(target=send, args=(base,)) for base in (str(http.base_url), second_web)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [202, 409]
    (won,) = [r.json() for r in answers if r.status_code == 202]
    (lost,) = [r.json() for r in answers if r.status_code == 409]
    assert lost["code"] == "session_busy"
    assert Run.objects.filter(session_id=session).exclude(status=RunStatus.COMPLETED).count() == 1
    assert http.post(f"/v1/agents/{won['agent_id']}/cancel").status_code == 200


def test_messages_stream_sse_and_the_transcript_lists_every_turn(http: httpx.Client) -> None:
    session = new_session(http)
    with http.stream("POST", f"/v1/sessions/{session}/messages", json=body("P1", [{"echo": True}])) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(resp.iter_lines())
    assert [f["event"] for f in frames][:3] == ["session", "agent", "started"] and frames[-1]["event"] == "done"
    assert frames[0]["data"]["text"] == session
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "text")  # live pieces + the committed rest
    assert [m["text"][:2] for m in json.loads(text)["messages"]] == ["P0", "fi", "P1"]
    out = http.get(f"/v1/sessions/{session}/transcript").json()
    assert (out["session"]["id"], out["session"]["agent"]) == (session, "scripted")
    assert [(r["turn"], r["replays_session"], r["rolled_back"]) for r in out["runs"]] == [
        (0, False, False),
        (1, True, False),
    ]
    runs = [r["run_id"] for r in out["runs"]]
    assert [e["run_id"] for e in out["events"]] == sorted((e["run_id"] for e in out["events"]), key=runs.index)
    inputs = [e for e in out["events"] if e["type"] == "user_input"]
    assert [e["payload"]["segments"][0]["text"][:2] for e in inputs] == ["P0", "P1"]
    assert all(e["event"] == e["payload"] for e in inputs) and all(e["ts_ns"] > 0 for e in out["events"])


def test_bad_session_requests_are_4xx_with_a_code(http: httpx.Client) -> None:
    session = new_session(http)
    cases = [
        ("POST", f"/v1/sessions/{session}/messages", {**body("P", []), "agent": "scripted"}, 400, "invalid_body"),
        (
            "POST",
            f"/v1/sessions/{session}/messages",
            body("P", [], multitask_strategy="later"),
            422,
            "invalid_multitask_strategy",
        ),
        ("POST", "/v1/sessions/bad%20id/messages", body("P", []), 400, "invalid_request"),
        ("POST", "/v1/sessions/s_0000000000000000/messages", body("P", []), 404, "session_not_found"),
        ("GET", "/v1/sessions/s_0000000000000000/transcript", None, 404, "session_not_found"),
        ("POST", "/v1/sessions/s_0000000000000000/replay", {}, 404, "session_not_found"),
        ("POST", f"/v1/sessions/{session}/replay", {"compress": True}, 400, "invalid_body"),
        ("POST", f"/v1/sessions/{session}/replay", {"agent": "gone-agent"}, 409, "agent_gone"),
    ]
    for method, path, payload, status, code in cases:
        resp = http.request(method, path, json=payload)
        assert (resp.status_code, resp.json()["code"]) == (status, code), (path, resp.text)
    replayed = http.post(f"/v1/sessions/{session}/replay", json={}).json()
    assert replayed["new_session_id"] != session and replayed["events_copied"] == 2
    assert Run.objects.filter(session_id=session).count() == 1


def test_a_session_is_its_tenant_and_users_only(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    session = new_session(http, people["alice"])
    message = body("P1", [{"text": "x"}], background=True)
    for who in ("charlie", "bob"):  # another tenant; the same tenant, another user
        for method, path, payload in (
            ("POST", f"/v1/sessions/{session}/messages", message),
            ("POST", f"/v1/sessions/{session}/replay", {}),
            ("POST", "/v1/runs", {"agent": "scripted", "session_id": session, **message}),
        ):
            resp = http.request(method, path, json=payload, headers=people[who])
            assert (resp.status_code, resp.json()["code"]) == (404, "session_not_found"), (who, path)
    transcript = f"/v1/sessions/{session}/transcript"
    assert http.get(transcript, headers=people["charlie"]).status_code == 404
    assert http.get(transcript, headers=people["bob"]).status_code == 200  # reads follow the runs' rule (SPEC 8)
    assert http.post(f"/v1/sessions/{session}/messages", json=message, headers=people["alice"]).status_code == 202
    assert Run.objects.filter(session_id=session).count() == 2
