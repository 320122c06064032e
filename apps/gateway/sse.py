"""Streamed gateway responses: the provider's events paced with SSE keepalive
comments, and a response body that finishes its call however the stream ends
(completed, failed after the first byte, or abandoned by the client)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from django.conf import settings

from apps.core.errors import ApplicationError
from apps.gateway.calls import CLIENT_CLOSED, Call, outcome_of
from apps.gateway.providers import ProviderEvent

log = logging.getLogger("loomcycle.gateway")


async def paced_events(call: Call, first: ProviderEvent, keepalive_s: float) -> AsyncIterator[ProviderEvent | None]:
    """The call's events starting with `first`; None whenever `keepalive_s`
    pass without one (the stream writes a comment, which also tells a server
    that notices hang-ups only on writes that the client is gone)."""
    yield first
    pending: asyncio.Future[ProviderEvent | None] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(call.next_event())
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield None
                continue
            event, pending = pending.result(), None
            if event is None:
                return
            yield event
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # an abandoned read: the call's outcome is recorded by finish
            await asyncio.wait({pending})
            if not pending.cancelled() and pending.exception() is not None:
                log.info("gateway %s: read abandoned with %r", call.request_id, pending.exception())


class StreamBody:
    """A streamed response body. Django iterates it; if it is dropped before
    its first chunk (the client left between the response and its body), the
    call is still finished, from the finalizer."""

    def __init__(self, call: Call, chunks: AsyncIterator[bytes]) -> None:
        self._call = call
        self._chunks = chunks
        self._started = False
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> StreamBody:
        return self

    async def __anext__(self) -> bytes:
        self._started = True
        return await anext(self._chunks)

    def __del__(self) -> None:
        if not self._started:
            self._call.abandon_soon(self._loop)


def sse_keepalive_s() -> float:
    return max(1.0, settings.LOOMCYCLE.sse_keepalive_ms / 1000)


class Frames(Protocol):
    """A wire shape's stream translator."""

    def feed(self, event: ProviderEvent) -> bytes: ...

    def end(self) -> bytes: ...

    def error(self, exc: ApplicationError) -> bytes: ...


KEEPALIVE = b": keepalive\n\n"


async def stream_chunks(call: Call, first: ProviderEvent, head: bytes, frames: Frames) -> AsyncIterator[bytes]:
    """The response body of a streamed chat call; finishes the call however the stream ends."""
    outcome = (CLIENT_CLOSED, "client_closed")
    try:
        yield head
        async for event in paced_events(call, first, sse_keepalive_s()):
            chunk = KEEPALIVE if event is None else frames.feed(event)
            if chunk:
                yield chunk
        outcome = (200, "")
        yield frames.end()
    except ApplicationError as exc:  # after the first byte a failure is a frame, and the audited outcome
        outcome = (exc.status, exc.code)
        yield frames.error(exc)
    except BaseException as exc:
        outcome = outcome_of(exc)
        if outcome[0] == 500:
            log.error("gateway %s %s: stream failed: %r", call.endpoint, call.request_id, exc)
        raise
    finally:
        await call.finish(*outcome)
