"""The shared provider transport: SSE framing, Retry-After, and cancel while
a server holds back even its response headers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from apps.gateway.providers.base import ProviderCancelled, ProviderRequest
from apps.gateway.providers.http import Frame, HttpProvider, ProviderConfig, frames, retry_after_seconds
from apps.gateway.providers.openai import OpenAIProtocol


def test_sse_frames_join_data_lines_and_skip_comments() -> None:
    lines = [": keepalive", "event: a", "data: 1", "data: 2", "", "data:3", "", "", "event: tail", "data: x"]
    assert list(frames("sse", lines)) == [Frame("a", "1\n2"), Frame("", "3"), Frame("tail", "x")]


def test_ndjson_frames_skip_blank_lines() -> None:
    assert list(frames("ndjson", ['{"a":1}', "", '{"b":2}'])) == [Frame("", '{"a":1}'), Frame("", '{"b":2}')]


def test_retry_after_forms() -> None:
    assert retry_after_seconds(httpx.Headers({"retry-after": "7"})) == 7.0
    assert retry_after_seconds(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= (retry_after_seconds(httpx.Headers({"retry-after": when})) or 0) <= 31
    assert retry_after_seconds(httpx.Headers({"retry-after": "soon"})) is None
    assert retry_after_seconds(httpx.Headers({})) is None


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections, reads the request, never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        srv.close()


@pytest.mark.parametrize("local", [True, False])
def test_cancel_cuts_a_call_still_waiting_for_response_headers(silent_server: str, local: bool) -> None:
    cfg = ProviderConfig(
        id="slowpoke", driver="openai", base_url=silent_server, dialect="compat", local=local, read_timeout_s=30
    )
    provider = HttpProvider(cfg, OpenAIProtocol())
    request = ProviderRequest(
        model="m", system=[], messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    )
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.perf_counter()
    with pytest.raises(ProviderCancelled):
        list(provider.stream(request, cancel))
    assert time.perf_counter() - t0 < 1.0
