"""The LLM gateway over HTTP (SPEC 2.11) against a real Daphne, Postgres and
Redis, on the mock provider: OpenAI chat completions (JSON, stream, tools),
the native /v1/_llm/chat, embeddings, the error statuses, fairness, and the
audit rows and usage ledger each call leaves."""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.utils import timezone
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.gateway.audit import AuditWriter
from apps.gateway.embedders.hashing import MODEL as HASHING_MODEL
from apps.gateway.models import GatewayCall, UsageEntry
from apps.gateway.pricing import cost_usd
from apps.gateway.providers import Usage
from apps.gateway.services import CallRecord, gateway_audit_prune, gateway_calls_save, usage_entry_build
from apps.substrate import tokens
from tests.conftest import wait_for
from tests.factories.gateway import OPERATOR_KEY, chunk

pytestmark = pytest.mark.usefixtures("transactional_db")

MOCK = {"loomcycle_provider": "mock", "model": "mock-generic"}
HI = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_MODEL = "mock-tool-loop?tool=get_weather&calls=1&input=%7B%22city%22%3A%22Paris%22%7D"


def audit_row(request_id: str) -> GatewayCall:
    return wait_for(lambda: GatewayCall.objects.filter(request_id=request_id).first())  # type: ignore[no-any-return]


def data_lines(resp: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]


def sse_events(resp: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    event = ""
    for line in resp.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[len("data: ") :])))
    return out


# --- /v1/chat/completions ----------------------------------------------------------------


def test_chat_completion_answers_in_openai_shape_and_leaves_an_audit_row_and_a_ledger_entry(
    http: httpx.Client,
) -> None:
    resp = http.post("/v1/chat/completions", json={**MOCK, "messages": HI, "user": "u-42"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "mock-generic" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "ok"
    assert "tool_calls" not in choice["message"]
    usage = body["usage"]
    assert usage["prompt_tokens"] >= 1 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    row = audit_row(resp.headers["x-request-id"])
    assert (row.endpoint, row.provider, row.model, row.user_id) == ("chat.completions", "mock", "mock-generic", "u-42")
    assert (row.status_code, row.error_code, row.stream) == (200, "", False)
    assert row.subject == "open-mode" and row.input_tokens == usage["prompt_tokens"]
    entry = wait_for(lambda: UsageEntry.objects.filter(source="gateway", user_id="u-42").first())
    assert (entry.provider, entry.model, entry.run_id, entry.step) == ("mock", "mock-generic", "", None)
    assert entry.input_tokens == usage["prompt_tokens"] and entry.cost_usd == Decimal("0")


def test_streamed_completion_sends_role_content_finish_usage_then_done(http: httpx.Client) -> None:
    payload = {**MOCK, "messages": HI, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=payload) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = data_lines(resp)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "ok"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 0
    row = audit_row(resp.headers["x-request-id"])
    assert row.stream and row.status_code == 200


def test_a_tool_call_comes_back_as_openai_tool_calls_and_its_result_finishes_the_turn(http: httpx.Client) -> None:
    payload = {"loomcycle_provider": "mock", "model": TOOL_MODEL, "messages": HI, "tools": [WEATHER]}
    body = http.post("/v1/chat/completions", json={**payload, "tool_choice": "auto"}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("mock_tu_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}

    history = [*HI, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    done = http.post("/v1/chat/completions", json={**payload, "messages": history}).json()
    assert done["choices"][0]["message"]["content"] == "done"
    assert done["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_tool_call_is_one_delta_with_its_index(http: httpx.Client) -> None:
    payload = {"model": f"mock/{TOOL_MODEL}", "messages": HI, "tools": [WEATHER], "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=payload) as resp:
        chunks = [json.loads(line) for line in data_lines(resp)[:-1]]
    calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert len(calls) == 1 and calls[0][0]["index"] == 0
    assert calls[0][0]["function"]["name"] == "get_weather" and calls[0][0]["type"] == "function"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({**MOCK, "messages": HI, "n": 2}, "bad_request"),
        ({"loomcycle_provider": "nope", "model": "x", "messages": HI}, "provider_unavailable"),
        ({"model": "no-such-alias", "messages": HI}, "bad_request"),
        ({**MOCK, "messages": []}, "invalid_body"),
        ({**MOCK, "messages": [{"role": "tool", "content": "x"}]}, "bad_request"),
        (
            {
                **MOCK,
                "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}],
            },
            "bad_request",
        ),
        (  # image_url parts: tests/gateway/test_gateway_images.py
            {**MOCK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "invalid_image",
        ),
        ({**MOCK, "messages": HI, "user": "not an id!"}, "invalid_user_id"),
        ({**MOCK, "messages": HI, "loomcycle_user_tier": "gold"}, "unknown_user_tier"),
    ],
)
def test_a_bad_request_is_a_400_with_loomcycles_code(http: httpx.Client, payload: dict[str, Any], code: str) -> None:
    resp = http.post("/v1/chat/completions", json=payload)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == code and resp.json()["error"]


def test_a_tier_routes_to_its_first_candidate_and_never_falls_back(http: httpx.Client) -> None:
    # tests/loomcycle.test.yaml: tier low = [steady]; middle = [always-429, steady]
    low = http.post("/v1/chat/completions", json={"loomcycle_tier": "low", "messages": HI})
    assert low.status_code == 200 and low.json()["model"] == "mock-generic"
    assert audit_row(low.headers["x-request-id"]).provider == "mock-stable"
    middle = http.post("/v1/chat/completions", json={"loomcycle_tier": "middle", "messages": HI})
    assert middle.status_code == 502 and "mock 429" in middle.json()["error"]  # no switch to `steady` (SPEC 7.4)
    assert middle.headers["x-should-retry"] == "true" and middle.headers["retry-after"] == "1"


def test_a_tier_with_no_usable_candidate_is_a_503(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json={"loomcycle_tier": "high", "messages": HI})
    assert resp.status_code == 503 and resp.json()["code"] == "tier_unavailable"


def test_bad_json_oversized_and_non_json_bodies_are_refused_and_audited(http: httpx.Client) -> None:
    bad = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_json"
    big = http.post("/v1/chat/completions", json={**MOCK, "messages": [{"role": "user", "content": "x" * 1_100_000}]})
    assert big.status_code == 413 and big.json()["code"] == "payload_too_large"
    text = http.post("/v1/chat/completions", content=b"hi", headers={"content-type": "text/plain"})
    assert text.status_code == 415
    codes = wait_for(
        lambda: (
            set(GatewayCall.objects.values_list("status_code", "error_code"))
            >= {(400, "invalid_json"), (413, "payload_too_large"), (415, "unsupported_media_type")}
        )
    )
    assert codes


def test_a_provider_failure_before_the_first_byte_is_a_502_even_when_streaming(http: httpx.Client) -> None:
    failing = {"loomcycle_provider": "mock", "model": "mock-generic?rate_500=1", "messages": HI}
    for stream in (False, True):
        resp = http.post("/v1/chat/completions", json={**failing, "stream": stream})
        assert resp.status_code == 502 and resp.json()["code"] == "provider_call_failed"
        assert "mock 500" in resp.json()["error"] and resp.headers["x-should-retry"] == "true"
        row = audit_row(resp.headers["x-request-id"])
        assert (row.status_code, row.error_code, row.stream) == (502, "provider_call_failed", stream)
    assert not UsageEntry.objects.filter(model__startswith="mock-generic?rate_500").exists()


def test_mock_script_over_chat_completions_plays_the_script_and_refuses_a_bad_one(http: httpx.Client) -> None:
    script = [{"tool": "Lookup", "input": {"q": "x"}}, {"text": "found it"}]
    ask = [{"role": "user", "content": "go MOCK_SCRIPT: " + json.dumps(script)}]
    tool = {"type": "function", "function": {"name": "Lookup", "parameters": {"type": "object"}}}
    scripted = {"loomcycle_provider": "mock", "model": "mock-script"}
    first = http.post("/v1/chat/completions", json={**scripted, "messages": ask, "tools": [tool]}).json()
    (call,) = first["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("Lookup", {"q": "x"})
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    history = [*ask, first["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
    second = http.post("/v1/chat/completions", json={**scripted, "messages": history}).json()
    assert second["choices"][0]["message"]["content"] == "found it"
    bad = [{"role": "user", "content": 'MOCK_SCRIPT: [{"text": "a", "error": []}]'}]
    refused = http.post(
        "/v1/chat/completions", json={"loomcycle_provider": "mock", "model": "mock-script", "messages": bad}
    )
    assert refused.status_code == 502 and refused.json()["code"] == "provider_call_failed"
    assert "mock 400: mock-script: step 0: error must be 429, 500" in refused.json()["error"]
    assert refused.headers["x-should-retry"] == "false"


def test_a_token_principal_is_recorded_with_its_tenant_and_a_bad_token_is_a_401(http: httpx.Client) -> None:
    token = tokens.token_create(name="reader", tenant_id="acme", subject="alice", scopes=["runs:read"])["token"]
    ok = http.post("/v1/chat/completions", json={**MOCK, "messages": HI}, headers={"authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    row = audit_row(ok.headers["x-request-id"])
    assert (row.tenant_id, row.subject) == ("acme", "alice")
    entry = wait_for(lambda: UsageEntry.objects.filter(tenant_id="acme").first())
    assert entry.source == "gateway"
    tokens.token_create(name="ops", tenant_id="ops")  # an admin token closes open mode
    denied = http.post("/v1/chat/completions", json={**MOCK, "messages": HI})
    assert denied.status_code == 401


def test_a_client_that_hangs_up_during_the_provider_wait_is_audited_as_499(web: str) -> None:
    slow = {"loomcycle_provider": "mock", "model": "mock-generic?latency_ms=3000", "messages": HI, "user": "hangup"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(web + "/v1/chat/completions", json=slow, timeout=httpx.Timeout(30, read=0.5))
    row = wait_for(lambda: GatewayCall.objects.filter(user_id="hangup").first(), timeout=10)
    assert (row.status_code, row.error_code) == (499, "client_closed")
    assert row.latency_ms < 2500  # the provider call was cancelled, not waited out


# --- /v1/_llm/chat -----------------------------------------------------------------------


def test_native_chat_returns_content_blocks_stop_reason_and_usage(http: httpx.Client) -> None:
    resp = http.post("/v1/_llm/chat", json={"messages": HI, "provider": "mock", "model": "mock-generic"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("llm_") and body["request_id"].startswith("req_")
    assert (body["provider"], body["model"], body["stop_reason"]) == ("mock", "mock-generic", "end_turn")
    assert body["content"] == [{"type": "text", "text": "ok"}]
    assert set(body["usage"]) == {"input_tokens", "output_tokens"} and body["usage"]["input_tokens"] >= 1
    assert audit_row(body["request_id"]).endpoint == "llm.chat"


def test_native_tool_round_trip(http: httpx.Client) -> None:
    tools = [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}]
    first = http.post(
        "/v1/_llm/chat", json={"messages": HI, "provider": "mock", "model": TOOL_MODEL, "tools": tools}
    ).json()
    block = first["content"][0]
    assert first["stop_reason"] == "tool_use" and block["type"] == "tool_use"
    assert (block["name"], block["input"]) == ("get_weather", {"city": "Paris"})
    history = [
        *HI,
        {"role": "assistant", "tool_calls": [{"id": block["id"], "name": block["name"], "input": block["input"]}]},
        {"role": "tool", "tool_call_id": block["id"], "content": "sunny"},
    ]
    done = http.post("/v1/_llm/chat", json={"messages": history, "provider": "mock", "model": TOOL_MODEL}).json()
    assert done["content"] == [{"type": "text", "text": "done"}] and done["stop_reason"] == "end_turn"


def test_native_stream_frames_follow_the_spec_order(http: httpx.Client) -> None:
    payload = {"messages": HI, "model": "mock/mock-generic", "stream": True}
    with http.stream("POST", "/v1/_llm/chat", json=payload) as resp:
        events = sse_events(resp)
    names = [name for name, _ in events]
    assert names == [
        "provider_chosen",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "done",
    ]
    assert events[0][1]["provider"] == "mock" and events[0][1]["request_id"].startswith("req_")
    assert events[1][1] == {"index": 0, "block": {"type": "text"}}
    assert events[2][1] == {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}
    assert events[4][1]["delta"] == {"stop_reason": "end_turn"} and events[5][1]["id"].startswith("llm_")


def test_a_native_stream_that_starts_with_a_tool_use_puts_it_at_index_0(http: httpx.Client) -> None:
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    payload = {"messages": HI, "provider": "mock", "model": TOOL_MODEL, "tools": tools, "stream": True}
    with http.stream("POST", "/v1/_llm/chat", json=payload) as resp:
        events = sse_events(resp)
    start = next(data for name, data in events if name == "content_block_start")
    assert start["index"] == 0 and start["block"]["type"] == "tool_use" and start["block"]["name"] == "get_weather"
    assert ("content_block_stop", {"index": 0}) in events
    assert events[-1][0] == "done" and events[-1][1]["stop_reason"] == "tool_use"


def test_native_errors_use_loomcycles_codes(http: httpx.Client) -> None:
    assert http.post("/v1/_llm/chat", json={"messages": HI}).json()["code"] == "bad_request"
    unknown = http.post("/v1/_llm/chat", json={"messages": HI, "provider": "nope", "model": "m"})
    assert unknown.status_code == 400 and unknown.json()["code"] == "provider_unavailable"
    missing = http.post("/v1/_llm/chat", json={"messages": [], "provider": "mock", "model": "m"})
    assert missing.status_code == 400
    failed = http.post(
        "/v1/_llm/chat", json={"messages": HI, "provider": "mock", "model": "mock-generic?rate_500=1", "stream": True}
    )
    assert failed.status_code == 502 and failed.json()["code"] == "provider_call_failed"


# --- /v1/embeddings ------------------------------------------------------------------------


def test_embeddings_float_and_base64_carry_the_same_vectors(http: httpx.Client) -> None:
    texts = ["the cat sat", "on the mat"]
    floats = http.post("/v1/embeddings", json={"input": texts, "model": "text-embedding-3-small"})
    assert floats.status_code == 200, floats.text
    body = floats.json()
    assert body["object"] == "list" and body["model"] == "text-embedding-3-small"
    assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    assert [d["index"] for d in body["data"]] == [0, 1] and all(d["object"] == "embedding" for d in body["data"])
    vectors = [d["embedding"] for d in body["data"]]
    assert len(vectors[0]) == 384 and vectors[0] != vectors[1]

    packed = http.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    for item, vector in zip(packed["data"], vectors, strict=True):
        raw = base64.b64decode(item["embedding"])
        decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert decoded == pytest.approx(vector, abs=1e-6)  # float32 on the wire
    single = http.post("/v1/embeddings", json={"input": "the cat sat"}).json()
    assert single["data"][0]["embedding"] == vectors[0] and single["model"] == HASHING_MODEL
    rows = GatewayCall.objects.filter(endpoint="embeddings", status_code=200, provider="hashing")
    assert wait_for(lambda: rows.count() == 3)


def test_token_arrays_are_refused(http: httpx.Client) -> None:
    resp = http.post("/v1/embeddings", json={"input": [[1, 2, 3]]})
    assert resp.status_code == 400 and "token arrays" in resp.json()["error"]


# --- a second web process: no embedder, a per-user cap of 1, an OpenAI-compatible upstream ---------


def test_a_slow_upstream_stream_is_relayed_with_keepalives_in_between(alt_web: str, httpserver: HTTPServer) -> None:
    def slow_sse(request: Request) -> Response:
        assert json.loads(request.data)["stream"] is True  # the driver always streams

        def body() -> Iterator[bytes]:
            yield chunk({"role": "assistant", "content": "Bonjour"})
            time.sleep(2.5)  # longer than the 1 s keepalive of this web process
            yield chunk({"content": ", Paris"})
            yield chunk({}, "stop")
            usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
            yield b"data: " + json.dumps({"id": "chatcmpl-up", "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return Response(body(), content_type="text/event-stream")

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(slow_sse)
    payload = {"model": "up/up-model", "messages": HI, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", alt_web + "/v1/chat/completions", json=payload, timeout=30) as resp:
        assert resp.status_code == 200
        lines = list(resp.iter_lines())
    assert ": keepalive" in lines
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Bonjour, Paris"
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 3,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    row = audit_row(resp.headers["x-request-id"])
    assert (row.provider, row.model, row.status_code, row.input_tokens, row.output_tokens) == (
        "up",
        "up-model",
        200,
        9,
        3,
    )
    entry = wait_for(lambda: UsageEntry.objects.filter(provider="up").first())
    assert entry.cost_usd is None  # an unknown endpoint's model is unpriced, not free


def test_an_upstream_error_is_a_502_that_names_the_provider(alt_web: str, httpserver: HTTPServer) -> None:
    error = {"error": {"message": "model up-model is overloaded", "type": "server_error"}}
    httpserver.expect_request("/v1/chat/completions").respond_with_json(error, status=503)
    resp = httpx.post(alt_web + "/v1/chat/completions", json={"model": "up/up-model", "messages": HI})
    assert resp.status_code == 502 and resp.json()["code"] == "provider_call_failed"
    assert "up 503: model up-model is overloaded" in resp.json()["error"]
    assert resp.json()["details"]["provider_status"] == 503


def _answer_if_keyed(request: Request) -> Response:
    assert request.headers.get("authorization") == f"Bearer {OPERATOR_KEY}"  # the operator's key was spent
    body = chunk({"role": "assistant", "content": "paid"}, "stop") + b"data: [DONE]\n\n"
    return Response(body, content_type="text/event-stream")


def test_the_operators_key_is_spent_only_for_principals_with_providers_operator_key(
    alt_web: str, httpserver: HTTPServer
) -> None:
    """Issue 33: a token without providers:operator-key (held, or implied by substrate:tenant or
    admin) is 403 operator_key_restricted on a keyed provider, on both chat endpoints; the open
    principal, admins, tenants and holders of the scope are served; keyless providers stay open."""
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(_answer_if_keyed)
    compat = {"model": "keyed/up-model", "messages": HI}
    native = {"provider": "keyed", "model": "up-model", "messages": HI}
    assert httpx.post(alt_web + "/v1/chat/completions", json=compat).status_code == 200  # open mode: admin
    tokens.token_create(name="ops", tenant_id="ops")  # an admin token closes open mode

    def bearer(name: str, scopes: list[str]) -> dict[str, str]:
        token = tokens.token_create(name=name, tenant_id="acme", subject=name, scopes=scopes)["token"]
        return {"authorization": f"Bearer {token}"}

    refused = [bearer("member", ["runs:create", "runs:read"]), bearer("end-user", ["substrate:user"])]
    served = [bearer("keyholder", ["runs:create", "providers:operator-key"]), bearer("tenant", ["substrate:tenant"])]
    for headers in refused:
        for path, payload in (("/v1/chat/completions", compat), ("/v1/_llm/chat", native)):
            resp = httpx.post(alt_web + path, json=payload, headers=headers)
            assert resp.status_code == 403, resp.text
            assert resp.json()["code"] == "operator_key_restricted"
            assert resp.json()["details"] == {"provider": "keyed", "required_scope": "providers:operator-key"}
        row = audit_row(resp.headers["x-request-id"])
        assert (row.provider, row.status_code, row.error_code) == ("keyed", 403, "operator_key_restricted")
        keyless = httpx.post(alt_web + "/v1/chat/completions", json={**MOCK, "messages": HI}, headers=headers)
        assert keyless.status_code == 200  # the mock spends no key
    for headers in served:
        resp = httpx.post(alt_web + "/v1/chat/completions", json=compat, headers=headers)
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "paid"
    assert len(httpserver.log) == 1 + len(served)  # the refused calls never reached the upstream


def test_embeddings_without_an_embedder_is_a_503(alt_web: str) -> None:
    resp = httpx.post(alt_web + "/v1/embeddings", json={"input": "x"})
    assert resp.status_code == 503 and resp.json()["code"] == "embedder_not_configured"
    assert resp.headers["x-should-retry"] == "false"


def test_a_users_second_concurrent_call_is_refused_with_429(alt_web: str) -> None:
    slow = {"loomcycle_provider": "mock", "model": "mock-generic?latency_ms=1500", "messages": HI, "user": "busy"}
    first: dict[str, int] = {}
    holder = threading.Thread(
        target=lambda: first.setdefault("status", httpx.post(alt_web + "/v1/chat/completions", json=slow).status_code)
    )
    holder.start()
    try:
        stats = alt_web + "/v1/_concurrency/stats"
        wait_for(lambda: httpx.get(stats).json()["per_user"].get("busy") == 1, timeout=5)  # the slot is held
        refused = httpx.post(alt_web + "/v1/chat/completions", json={**slow, "model": "mock-generic"})
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["code"] == "per_user_quota_exhausted" and body["user_id"] == "busy" and body["cap"] == 1
        assert refused.headers["retry-after"] == "5"
        other = httpx.post(alt_web + "/v1/chat/completions", json={**slow, "model": "mock-generic", "user": "idle"})
        assert other.status_code == 200
    finally:
        holder.join(10)
    assert first["status"] == 200


# --- services -------------------------------------------------------------------------------


def record(request_id: str, *, days_ago: int = 0, latency_ms: int = 3, usage: Usage | None = None) -> CallRecord:
    return CallRecord(
        request_id=request_id,
        tenant_id="acme",
        user_id="u",
        subject="s",
        endpoint="chat.completions",
        provider="mock",
        model="mock-generic",
        stream=False,
        status_code=200,
        error_code="",
        latency_ms=latency_ms,
        created_at=timezone.now() - timedelta(days=days_ago),
        usage=usage,
    )


def test_audit_prune_deletes_only_rows_past_the_retention_and_keeps_the_ledger() -> None:
    gateway_calls_save(records=[record("req_old", days_ago=40), record("req_new", days_ago=1)])
    UsageEntry.objects.create(
        created_at=timezone.now() - timedelta(days=400), source="gateway", provider="mock", model="m"
    )
    assert gateway_audit_prune(retention_days=30) == 1
    mine = GatewayCall.objects.filter(request_id__in=["req_old", "req_new"])  # web processes may still be writing
    assert list(mine.values_list("request_id", flat=True)) == ["req_new"]
    assert gateway_audit_prune(retention_days=30) == 0  # idempotent
    assert gateway_audit_prune(retention_days=0) == 0  # 0 = keep forever
    assert UsageEntry.objects.filter(model="m").count() == 1


def test_a_row_the_database_refuses_is_logged_and_does_not_hold_back_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = AuditWriter()
    usage = Usage(input_tokens=10, output_tokens=2, model="mock-generic", provider="mock")
    for rec in (record("req_a", usage=usage), record("req_bad", latency_ms=-1), record("req_b")):
        writer.record(rec)  # a negative latency breaks the column's CHECK constraint
    writer.close()
    stored = set(GatewayCall.objects.filter(request_id__startswith="req_").values_list("request_id", flat=True))
    assert {"req_a", "req_b"} <= stored and "req_bad" not in stored
    assert writer.dropped == 1 and writer.pending() == 0
    assert any("gateway audit row lost" in r.message and "req_bad" in r.message for r in caplog.records)
    assert UsageEntry.objects.filter(user_id="u", input_tokens=10, source="gateway").count() == 1


def test_costs_come_from_the_price_table_and_unknown_models_are_unpriced() -> None:
    usage = Usage(
        input_tokens=1000,
        output_tokens=500,
        cache_creation_input_tokens=2000,
        cache_read_input_tokens=10_000,
        model="claude-sonnet-4-5-20250929",
        provider="anthropic",
    )
    assert cost_usd("anthropic", "claude-sonnet-4-5-20250929", usage) == Decimal("0.021000")
    assert cost_usd("openai", "gpt-4o-mini-2024-07-18", usage) == cost_usd("openai", "gpt-4o-mini", usage)
    assert cost_usd("openai", "gpt-4o-audio-preview", usage) is None  # a prefix is not a snapshot
    assert cost_usd("fake", "gpt-4o", usage) is None  # an unknown endpoint's prices are unknown
    assert cost_usd("mock", "mock-generic", usage) == Decimal("0")
    entry = usage_entry_build(tenant_id="acme", user_id="u", run_id="r_1", step=3, source="run", usage=usage)
    assert entry.pk is None and entry.cost_usd == Decimal("0.021000") and (entry.run_id, entry.step) == ("r_1", 3)
    entry.save()
    assert UsageEntry.objects.get(run_id="r_1").cost_usd == Decimal("0.021000")
