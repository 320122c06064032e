"""Bad input is a 4xx with a machine-readable code, never a 500 or an HTML
page (issue 16 item 4): NUL characters, deep nesting, over-long scope ids,
malformed mock options, unknown routes, and bodies over the cap, which Daphne
refuses while it reads them. All against the real Daphne process."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.test import RequestFactory
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.gateway.providers.mock import MAX_LATENCY_MS, mock_options
from apps.memory.models import MemoryEntry
from apps.runs.models import Run, RunStatus
from loomcycle_project.api import api
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents")


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body: dict[str, Any] = resp.json()
    assert body["code"] == code and body["error"], body
    return body


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_nul_in_any_string_field_is_a_400_and_stores_nothing(http: httpx.Client) -> None:
    for body in (
        {"agent": "echo", "prompt": "hi\u0000there", "background": True},
        {"agent": "echo", "prompt": "hi", "background": True, "metadata": {"k\u0000": "v"}},
        {"agent": "echo", "prompt": "hi", "background": True, "metadata": {"list": ["ok", "\u0000"]}},
    ):
        body_out = assert_error(http.post("/v1/runs", json=body), 400, "invalid_body")
        assert "NUL" in body_out["error"]
    assert not Run.objects.exists()
    assert_error(http.put("/v1/_memory/scopes/user/u1/keys/k", json={"value": "a\u0000b"}), 400, "invalid_body")
    assert not MemoryEntry.objects.filter(scope_id="u1", key="k").exists()


def test_a_lone_surrogate_in_any_string_is_a_400(http: httpx.Client) -> None:
    raw = '{"agent":"echo","prompt":"hi \\ud800","background":true}'  # valid JSON, not storable text
    json_type = {"content-type": "application/json"}
    out = assert_error(http.post("/v1/runs", content=raw, headers=json_type), 400, "invalid_body")
    assert "surrogate" in out["error"]
    run = http.post("/v1/runs", json={"agent": "chat", "prompt": "hi", "background": True, "interactive": True}).json()
    steer = '{"text":"\\udfff"}'
    resp = http.post(f"/v1/runs/{run['run_id']}/input", content=steer, headers=json_type)
    assert_error(resp, 400, "invalid_body")


def test_a_nul_in_the_path_or_query_is_a_400(http: httpx.Client) -> None:
    assert_error(http.get("/v1/_memory/scopes/user/u%00x/keys/k"), 400, "invalid_request")
    assert_error(http.get("/v1/users/u1/agents", params={"status": "run\u0000ning"}), 400, "invalid_request")


def test_deep_nesting_is_a_400_at_any_depth(http: httpx.Client) -> None:
    body = {"agent": "echo", "prompt": "hi", "background": True, "metadata": nested(100)}
    assert_error(http.post("/v1/runs", json=body), 400, "invalid_body")
    deep = '{"agent":"echo","prompt":"hi","metadata":' + "[" * 100_000 + "]" * 100_000 + "}"
    out = assert_error(
        http.post("/v1/runs", content=deep, headers={"content-type": "application/json"}), 400, "invalid_body"
    )
    assert "nested deeper" in out["error"]
    assert not Run.objects.exists()
    shallow = {"agent": "echo", "prompt": "hi", "background": True, "metadata": nested(60)}
    assert http.post("/v1/runs", json=shallow).status_code == 202


def test_an_over_long_scope_id_is_a_400(http: httpx.Client) -> None:
    long_id = "u" * 300
    assert_error(http.put(f"/v1/_memory/scopes/user/{long_id}/keys/k", json={"value": 1}), 400, "invalid_scope_id")
    assert_error(http.get(f"/v1/_memory/scopes/user/{long_id}/keys"), 400, "invalid_scope_id")
    assert http.put(f"/v1/_memory/scopes/user/{'u' * 256}/keys/k", json={"value": 1}).status_code == 200


def test_malformed_mock_options_are_refused_where_the_model_is_named(http: httpx.Client) -> None:
    chat = {
        "loomcycle_provider": "mock",
        "model": "mock-generic?latency_ms=x",
        "messages": [{"role": "user", "content": "hi"}],
    }
    out = assert_error(http.post("/v1/chat/completions", json=chat), 400, "invalid_model_options")
    assert "latency_ms" in out["error"]
    overlay = {"provider": "mock", "model": "mock-generic?rate_429=nan", "tools": []}
    resp = http.post("/v1/_agentdef", json={"op": "create", "name": "badmock", "overlay": overlay})
    assert resp.status_code in (400, 422) and "rate_429" in resp.text, resp.text
    assert resp.json()["code"]


def test_mock_options_are_clamped() -> None:
    opts = mock_options("latency_ms=1e12&jitter_ms=-5&rate_429=7&calls=1e9")
    assert opts.number("latency_ms", 0) == MAX_LATENCY_MS
    assert opts.number("jitter_ms", 1) == 0.0
    assert opts.number("rate_429", 0) == 1.0
    assert opts.number("calls", 0) == 1000
    with pytest.raises(ValueError, match="calls"):
        mock_options("calls=many")


def test_an_unknown_api_route_is_a_json_404(http: httpx.Client) -> None:
    assert_error(http.get("/v1/no/such/route"), 404, "not_found")
    assert_error(http.post("/v1/runs/r_x/nothing", json={}), 404, "not_found")


def test_an_unexpected_error_in_a_route_is_a_json_500() -> None:
    request = RequestFactory().get("/v1/runs/r_1")
    resp = api.on_exception(request, RuntimeError("boom"))
    assert resp.status_code == 500
    body = json.loads(resp.content)
    assert body["code"] == "internal_error" and "boom" not in body["error"]


def _raw(base: str, head: bytes) -> socket.socket:
    parts = urlsplit(base)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(head)
    return sock


def _response(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_sent(http: httpx.Client, web: str) -> None:
    sock = _raw(
        web,
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000000\r\n\r\n",
    )
    with sock:
        out = _response(sock)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["code"] == "payload_too_large"


def test_a_chunked_upload_is_cut_off_at_the_cap_while_it_is_read(http: httpx.Client, web: str) -> None:
    """The server answers 413 and hangs up once the cap (16 MiB in tests) is
    passed: the client cannot push the rest of its 256 MiB."""
    sock = _raw(
        web,
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
    )
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    sent = 0
    deadline = time.monotonic() + 30
    with sock:
        try:
            while sent < 256 and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            sent = -sent  # the server hung up mid-upload: what this test wants (sent stays counted)
        out = _response(sock)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert abs(sent) < 256, "the server read a 256 MiB body it should have cut off at 16 MiB"


# Numbers in headers and query strings (issue 33, item 13): "²".isdigit() is True and int("²")
# raises; a 5,000-digit value is past int()'s digit limit and a 20-digit one past Postgres bigint.
BAD_NUMBERS = ["²", "1²", "٣", "9" * 5000, "9" * 20, "-1", " 1"]


def status_of(http: httpx.Client, path: str, headers: Any = None) -> tuple[int, str]:
    """A GET's status and content type, without reading a stream's live tail."""
    with http.stream("GET", path, headers=headers) as resp:
        return resp.status_code, resp.headers.get("content-type", "")


def test_a_bad_number_in_a_header_or_query_is_never_a_500(http: httpx.Client) -> None:
    created = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True})
    assert created.status_code == 202, created.text
    run_id, agent_id = created.json()["run_id"], created.json()["agent_id"]
    for raw in BAD_NUMBERS:
        bad_number_probes(http, run_id, raw)
    assert http.post(f"/v1/agents/{agent_id}/cancel", json={}).status_code == 200  # no worker: not left queued
    wait_status(run_id, RunStatus.CANCELLED, RunStatus.COMPLETED)  # a worker of another module may finish it first


def bad_number_probes(http: httpx.Client, run_id: str, raw: str) -> None:
    header: Any = {"Last-Event-ID": raw.strip().encode()}  # bytes: httpx sends them as written
    assert status_of(http, f"/v1/runs/{run_id}/stream", header)[0] == 200  # unusable: replay from the start
    for path in (
        f"/v1/runs/{run_id}/events?from_seq={raw}",
        f"/v1/runs/{run_id}/events?limit={raw}",
        f"/v1/runs/{run_id}/stream?from_seq={raw}",
        f"/v1/_memory/scopes/user/u1/keys?limit={raw}",
        f"/v1/_snapshots?limit={raw}",
        f"/v1/users/u1/channels/nothing/peek?max_messages={raw}",
    ):
        status, ctype = status_of(http, path)
        assert 400 <= status < 500 or status == 200, (path, raw, status)
        assert ctype.startswith(("application/json", "text/event-stream")), (path, ctype)
    query = urllib.parse.quote(raw)  # none is a usable sequence number: the socket is refused, 4400
    url = str(http.base_url).replace("http://", "ws://").rstrip("/") + f"/ws/runs/{run_id}/?from_seq={query}"
    with connect(url) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400, raw
