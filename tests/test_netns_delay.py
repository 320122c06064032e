"""The user-space slow link of the partition harness (tests/netns_delay.py): it forwards with no
added delay until SIGUSR1, then holds each chunk back 200 ms ± 100 ms in each direction, keeping
each direction's byte order, and forwards promptly again after SIGUSR2."""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.netns_delay import DELAY_S, JITTER_S


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxied() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as probe:  # a free port for the proxy
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    route = f"{port}:127.0.0.1:{server.server_address[1]}"
    argv = [sys.executable, "-m", "tests.netns_delay", "127.0.0.1", route]
    proxy = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        wait_for(lambda: _listens(port), timeout=30)
        yield port, proxy
    finally:
        proxy.kill()
        proxy.wait(10)
        server.shutdown()
        server.server_close()


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _switch(proxy: subprocess.Popen[bytes], sig: signal.Signals, state: bytes) -> None:
    """The signal sent, and the proxy's word that its loop took it."""
    os.kill(proxy.pid, sig)
    assert proxy.stdout is not None
    while not (line := proxy.stdout.readline()).endswith(b"fault " + state + b"\n"):
        assert line, "the proxy exited"


def _round_trips(conn: socket.socket, n: int) -> tuple[list[float], bytes]:
    """`n` chunks sent back to back, then every byte echoed read back: each chunk's round trip."""
    sent = [time.monotonic()]
    for i in range(n):
        conn.sendall(f"<{i:04d}>".encode())
        time.sleep(0.01)  # separate chunks, so each gets a delay of its own
        sent.append(time.monotonic())
    got, trips = b"", []
    while len(got) < 6 * n:
        got += conn.recv(65536)
        trips.append(time.monotonic() - sent[0])
    return trips, got


def test_the_delay_proxy_holds_chunks_back_only_while_on_and_keeps_their_order(
    proxied: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, proxy = proxied
    want = b"".join(f"<{i:04d}>".encode() for i in range(40))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        trips, got = _round_trips(conn, 1)
        assert got == want[:6] and trips[0] < DELAY_S - JITTER_S  # off: no added delay
        _switch(proxy, signal.SIGUSR1, b"on")
        trips, got = _round_trips(conn, 40)
        assert got == want  # both directions' order kept across jittered delays
        assert trips[0] >= 2 * (DELAY_S - JITTER_S)  # each way held back at least 100 ms
        _switch(proxy, signal.SIGUSR2, b"off")
        trips, got = _round_trips(conn, 1)
        assert got == want[:6] and trips[0] < DELAY_S - JITTER_S
