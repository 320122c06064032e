"""loomcycle_http.client retries a request the server refused with 429 or 503, waiting what its
Retry-After says (bounded), as the openai and anthropic SDKs do; other refusals are raised at once.
The server is a local HTTP server answering the API's wire shapes (pytest-httpserver)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from pytest_httpserver import HTTPServer

from loomcycle_http.client import AsyncClient, Client, RateLimited, Retries, ServerError
from loomcycle_http.client.errors import error_from_response

RUN = {"agent_id": "a_1", "run_id": "r_1", "status": "completed"}


def _refuse(server: HTTPServer, status: int, code: str, retry_after: str | None) -> None:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = {"code": code, "error": code, "details": {}}
    server.expect_ordered_request("/v1/runs/r_1").respond_with_json(body, status=status, headers=headers)


def test_a_429_then_a_503_are_retried_after_their_retry_after(httpserver: HTTPServer) -> None:
    _refuse(httpserver, 429, "rate_limited", "0.3")
    _refuse(httpserver, 503, "runtime_paused", "0.2")
    httpserver.expect_ordered_request("/v1/runs/r_1").respond_with_json(RUN)
    with Client(httpserver.url_for("/")) as lc:
        started = time.monotonic()
        assert lc.runs.get("r_1") == RUN
        assert time.monotonic() - started >= 0.5  # both waits the server asked for
    assert len(httpserver.log) == 3


def test_retries_are_bounded_and_the_last_refusal_is_raised(httpserver: HTTPServer) -> None:
    for _ in range(2):
        _refuse(httpserver, 429, "rate_limited", "0")
    with Client(httpserver.url_for("/"), retries=Retries(max_retries=1)) as lc, pytest.raises(RateLimited) as raised:
        lc.runs.get("r_1")
    assert raised.value.retry_after == 0.0 and len(httpserver.log) == 2


def test_a_long_retry_after_is_capped_and_other_errors_are_not_retried(httpserver: HTTPServer) -> None:
    assert Retries(max_wait_s=5).wait(0, 3600) == 5
    assert Retries(max_retries=0).wait(0, 1) is None
    _refuse(httpserver, 500, "internal_error", None)
    with Client(httpserver.url_for("/")) as lc, pytest.raises(ServerError):
        lc.runs.get("r_1")
    assert len(httpserver.log) == 1


def test_the_async_client_retries_the_same_way(httpserver: HTTPServer) -> None:
    _refuse(httpserver, 503, "database_unavailable", "0.1")
    httpserver.expect_ordered_request("/v1/runs/r_1").respond_with_json(RUN)

    async def read() -> dict[str, object]:
        async with AsyncClient(httpserver.url_for("/")) as lc:
            return await lc.runs.get("r_1")

    assert asyncio.run(read()) == RUN and len(httpserver.log) == 2


def test_retry_after_as_an_http_date_is_read_as_seconds() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    resp = httpx.Response(429, headers={"Retry-After": when}, json={"code": "rate_limited", "error": "x"})
    retry_after = error_from_response(resp).retry_after
    assert retry_after is not None and 25 <= retry_after <= 30
