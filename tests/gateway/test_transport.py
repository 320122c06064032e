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


def _body(*chunks: bytes, content_type: str = "text/event-stream") -> httpx.Response:
    """A streamed response whose body arrives in `chunks`, one read each."""
    return httpx.Response(200, headers={"content-type": content_type}, content=iter(chunks))


def test_sse_frames_join_data_lines_and_skip_comments_across_split_reads() -> None:
    """httpx-sse parses the frames (the client's parser too): a line cut across reads (even between
    CR and LF) is one line; a comment-only block after an `id:` is no frame; an event the stream
    ends inside (no blank line after it) is not dispatched (WHATWG)."""
    chunks = (b": keepalive\n", b"event: a\nda", b"ta: 1\ndata: 2\n\n", b"id: 7\ndata:3\r", b"\n\r\n: ping\n\n")
    response = _body(*chunks, b"event: tail\ndata: x")
    assert list(frames("sse", response)) == [Frame("a", "1\n2"), Frame("", "3")]


def test_sse_frames_refuse_a_body_that_is_not_an_event_stream() -> None:
    with pytest.raises(httpx.TransportError, match="text/event-stream"):  # a retryable status 0 upstream
        list(frames("sse", _body(b"data: 1\n\n", content_type="application/json")))


def test_ndjson_frames_skip_blank_lines() -> None:
    response = _body(b'{"a":1}\n\n{"b"', b":2}\n", content_type="application/x-ndjson")
    assert list(frames("ndjson", response)) == [Frame("", '{"a":1}'), Frame("", '{"b":2}')]


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
