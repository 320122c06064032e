"""`image_url` content parts on /v1/chat/completions, against a real Daphne whose
provider `up` (our OpenAI driver) points at a loopback OpenAI-compatible server:
a data: URL and an http URL (fetched through the SSRF guard) both reach the
upstream as the image; a model without vision, a bad data: URL and a host the
operator does not allow are 400s before anything is sent upstream."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tests.factories.gateway import chunk

pytestmark = pytest.mark.usefixtures("transactional_db")

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def _recording(seen: list[dict[str, Any]]) -> Any:
    def answer(request: Request) -> Response:
        seen.append(json.loads(request.data))
        body = chunk({"role": "assistant", "content": "a dot"}, "stop") + b"data: [DONE]\n\n"
        return Response(body, content_type="text/event-stream")

    return answer


def _look(url: str, model: str = "up/up-model") -> dict[str, Any]:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": model, "messages": [{"role": "user", "content": parts}]}


def test_a_data_url_image_reaches_the_upstream(alt_web: str, httpserver: HTTPServer) -> None:
    seen: list[dict[str, Any]] = []
    httpserver.expect_request("/v1/chat/completions").respond_with_handler(_recording(seen))
    resp = httpx.post(alt_web + "/v1/chat/completions", json=_look(DATA_URL), timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "a dot"
    assert seen[0]["messages"][-1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": DATA_URL}},
    ]


def test_an_http_image_url_is_fetched_and_sent_as_its_bytes(alt_web: str, httpserver: HTTPServer) -> None:
    seen: list[dict[str, Any]] = []
    httpserver.expect_request("/pic.png", method="GET").respond_with_data(PNG, content_type="image/png")
    httpserver.expect_request("/v1/chat/completions").respond_with_handler(_recording(seen))
    url = f"http://localhost:{httpserver.port}/pic.png"  # the stack allows `localhost`, also as a private host
    resp = httpx.post(alt_web + "/v1/chat/completions", json=_look(url), timeout=30)
    assert resp.status_code == 200, resp.text
    assert seen[0]["messages"][-1]["content"][1] == {"type": "image_url", "image_url": {"url": DATA_URL}}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (_look(DATA_URL, model="up/gpt-3.5-turbo"), "model_lacks_vision"),
        (_look("data:image/bmp;base64,AAAA"), "unsupported_image_type"),
        (_look("data:image/png;base64,@@@"), "invalid_image"),
        (_look("ftp://localhost/pic.png"), "invalid_image"),
        (_look("http://10.1.2.3/pic.png"), "image_url_refused"),
        (
            {
                "model": "up/up-model",
                "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}],
            },
            "bad_request",
        ),
    ],
)
def test_a_refused_image_is_a_400_before_the_upstream_is_called(
    alt_web: str,
    httpserver: HTTPServer,
    body: dict[str, Any],
    code: str,
) -> None:
    seen: list[dict[str, Any]] = []
    httpserver.expect_request("/v1/chat/completions").respond_with_handler(_recording(seen))
    resp = httpx.post(alt_web + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400 and resp.json()["code"] == code, resp.text
    assert seen == []
