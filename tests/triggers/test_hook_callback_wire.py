"""One hook callback against loopback servers speaking raw HTTP/1.1: the
total deadline against a trickling server, replies that must fail the call
(unparseable, unstorable) rather than the run, and the cookie-less client."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from apps.triggers.hooks import callback
from apps.triggers.hooks.callback import HookCallFailed
from apps.triggers.hooks.types import Hook
from apps.triggers.models import HookFailMode, HookPhase

Serve = Callable[[socket.socket, bytes], None]  # (connection, request bytes) -> writes its answer


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("127.0.0.1",))


@contextmanager
def raw_server(serve: Serve) -> Iterator[tuple[str, list[bytes]]]:
    """A one-thread-per-connection server; yields its URL and the requests it read."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)  # accept() wakes to see `stop`
    requests: list[bytes] = []
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            requests.append(head)
            try:
                serve(conn, head)
            except OSError:  # the client hung up (that is what the deadline does)
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/cb", requests
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def answer(body: bytes, extra: bytes = b"") -> Serve:
    def serve(conn: socket.socket, head: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"  # one request a connection
            + extra
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    return serve


def trickle(in_headers: bool) -> Serve:
    """One byte every 100 ms, for a minute: each read is quick, the whole never ends."""

    def serve(conn: socket.socket, head: bytes) -> None:
        if not in_headers:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(600):
            conn.sendall(b"x-pad: 1\r\n"[:1] if in_headers else b" ")
            time.sleep(0.1)  # the server's pace, not a synchronisation

    return serve


def hook(url: str, timeout_ms: int = 1000) -> Hook:
    return Hook(
        hook_id="hook_0000000000000000",
        tenant_id="acme",
        owner="sec",
        name="wire",
        phase=HookPhase.PRE,
        agents=("*",),
        tools=("*",),
        callback_url=url,
        fail_mode=HookFailMode.CLOSED,
        timeout_ms=timeout_ms,
    )


@pytest.mark.parametrize("in_headers", [True, False], ids=["headers", "body"])
def test_a_trickling_callback_fails_within_its_total_deadline(in_headers: bool) -> None:
    with raw_server(trickle(in_headers)) as (url, _):
        started = time.monotonic()
        with pytest.raises(HookCallFailed, match="timed out after 1000 ms"):
            callback.call(hook(url, timeout_ms=1000), {"phase": "pre"})
        assert time.monotonic() - started < 1.0 + 0.5


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": {"n": ' + b"9" * 5000 + b"}}",  # Python refuses ints past 4300 digits: ValueError
        b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError
        b'{"deny": {"text": "a\\u0000b"}}',  # NUL: jsonb refuses it at the step commit
        b'{"deny": {"text": "\\ud800"}}',  # a lone surrogate: likewise
        b"\xff\xfe",
    ],
    ids=["big-int", "deep", "nul", "surrogate", "not-utf8"],
)
def test_an_unusable_reply_is_a_failed_call(body: bytes) -> None:
    with raw_server(answer(body)) as (url, _), pytest.raises(HookCallFailed):
        callback.call(hook(url), {"phase": "pre"})


def test_a_cookie_set_by_one_callback_is_not_sent_on_the_next() -> None:
    with raw_server(answer(b"{}", b"set-cookie: sid=tenant-a; Path=/\r\n")) as (url, requests):
        assert callback.call(hook(url), {"phase": "pre"}) == {}
        assert callback.call(hook(url), {"phase": "pre"}) == {}
    assert len(requests) == 2
    assert all(b"cookie" not in r.lower().replace(b"set-cookie", b"") for r in requests)
