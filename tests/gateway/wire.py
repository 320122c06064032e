"""A loopback HTTP endpoint for driver tests: scripted responses in order
(streamed part by part, optionally stalling before or between parts) and a
record of every request's JSON body and headers. It speaks whatever wire
format the scripted bytes are; the tests supply real provider frames."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.gateway.providers.base import ProviderEvent, ProviderRequest
from apps.gateway.providers.http import HttpProvider

STALL = "stall"  # a body step: hold the connection open until the test ends
STALL_CAP_S = 10.0


@dataclass
class Script:
    status: int
    body: list[bytes | threading.Event | str]
    headers: dict[str, str] = field(default_factory=dict)
    stall_before_headers: bool = False


class Wire:
    """A loopback endpoint answering scripted responses in order and recording
    every request (JSON body and headers) it received."""

    def __init__(self, server: HTTPServer, path: str, content_type: str) -> None:
        self.server = server
        self.content_type = content_type
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.scripts: deque[Script] = deque()
        self.release = threading.Event()
        server.expect_request(path, method="POST").respond_with_handler(self._handle)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def reply(self, *body: bytes | threading.Event | str, status: int = 200, **kw: Any) -> None:
        self.scripts.append(Script(status, list(body), **kw))

    def _handle(self, request: Request) -> Response:
        self.requests.append(request.get_json())
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        script = self.scripts.popleft()
        if script.stall_before_headers:
            self.release.wait(STALL_CAP_S)
        body = self._stream(script.body)
        return Response(body, status=script.status, headers=script.headers, content_type=self.content_type)

    def _stream(self, parts: list[bytes | threading.Event | str]) -> Iterator[bytes]:
        yield b""  # the status line and headers go out now
        for part in parts:
            if isinstance(part, threading.Event):
                part.wait(STALL_CAP_S)
            elif part == STALL:
                self.release.wait(STALL_CAP_S)
            elif isinstance(part, bytes):
                yield part


@pytest.fixture(scope="module")
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def serve(server: HTTPServer, path: str, content_type: str) -> Iterator[Wire]:
    """The body of a test's `wire` fixture: the endpoint, then a clean server."""
    endpoint = Wire(server, path, content_type)
    try:
        yield endpoint
    finally:
        endpoint.release.set()  # frees handlers still stalling
        errors = list(server.handler_errors)
        server.clear()  # this test's handler and log
        assert not errors, f"the fake server's handler failed: {errors}"


# --- playing a provider both ways ---------------------------------------------


def play(provider: HttpProvider, req: ProviderRequest) -> list[ProviderEvent]:
    """The blocking path (worker threads)."""
    return list(provider.stream(req, threading.Event()))


async def drain(events: AsyncIterator[ProviderEvent]) -> list[ProviderEvent]:
    return [event async for event in events]


def aplay(provider: HttpProvider, req: ProviderRequest) -> list[ProviderEvent]:
    """The async path (the gateway's event loop), on a fresh loop and client."""

    async def run() -> list[ProviderEvent]:
        try:
            return await drain(provider.astream(req))
        finally:
            await provider.aclient().aclose()

    return asyncio.run(run())


Collect = Callable[[HttpProvider, ProviderRequest], list[ProviderEvent]]


@pytest.fixture(params=["stream", "astream"])
def collect(request: pytest.FixtureRequest) -> Collect:
    return play if request.param == "stream" else aplay


def cancel_after(seconds: float) -> threading.Event:
    """A cancel Event that a daemon timer sets after `seconds`."""
    cancel = threading.Event()
    timer = threading.Timer(seconds, cancel.set)
    timer.daemon = True
    timer.start()
    return cancel
