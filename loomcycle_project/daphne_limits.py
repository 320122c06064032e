"""A request-body cap inside Daphne, enforced while the body is read.

Daphne has no body limit of its own: Twisted buffers the whole request body
(to a temporary file past 100 kB, chunked uploads included) before Daphne
hands it to Django, so a route's own cap (apps.core.http.parse_body) only
runs after an unbounded upload has landed on disk. `install` makes Daphne
build its requests from `CappedWebRequest`, which answers 413
`payload_too_large` and closes the connection as soon as the declared
`Content-Length` or the bytes received exceed the cap: before Django,
authentication or any route runs.

What this relies on, and what an upgrade must keep: `daphne.server` names
`HTTPFactory` at module level and instantiates it in `Server.run`, and
`HTTPFactory.buildProtocol` sets `protocol.requestFactory`; Twisted calls
`Request.gotLength` and `Request.handleContentChunk` while it reads the body,
then `Request.requestReceived` (which a refused request ignores: the chunked
terminator may arrive in the same read as the chunk that crossed the cap).
tests/core/test_bad_input.py fails if any of that changes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import daphne.server
from daphne.http_protocol import HTTPFactory, WebRequest

log = logging.getLogger("loomcycle.web")


def payload_too_large_response(max_bytes: int) -> bytes:
    body = json.dumps(
        {"code": "payload_too_large", "error": f"request body exceeds {max_bytes} bytes", "details": {}}
    ).encode()
    head = (
        "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class CappedWebRequest(WebRequest):
    max_bytes = 16 * 1024 * 1024
    _received = 0
    _refused = False

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_bytes:
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self.max_bytes:
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return  # answered 413 already: never hand a truncated body to the application
        super().requestReceived(command, path, version)

    def _refuse(self) -> None:
        """Answer 413 on the raw transport and hang up: the rest of the body is never read."""
        self._refused = True
        log.warning("refused a request body over %d bytes from %s", self.max_bytes, self.getClientAddress())
        self.channel.transport.write(payload_too_large_response(self.max_bytes))
        self.channel.transport.loseConnection()


class CappedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = CappedWebRequest
        return protocol


def install(max_bytes: int) -> None:
    """Every Daphne server this process starts from now on caps bodies at `max_bytes`."""
    CappedWebRequest.max_bytes = max_bytes
    daphne.server.HTTPFactory = CappedHTTPFactory
