"""The MCP SDK's HTTP client (httpx2) on the SSRF guard (apps.core.egress).

The SDK speaks streamable HTTP through an `httpx2.AsyncClient`; httpx2 is a fork
of httpx that sits on httpcore2, so egress's httpx transport does not plug in.
This transport does what egress's own transport does, on egress's public parts:
`check_url` on every request (each redirect hop is a request), then httpcore's
pool over the guarded backend (`egress.async_pool`), which resolves, refuses a
non-public address unless the host is privately allowlisted, and dials only a
checked address. Environment proxies are off (`trust_env=False`).
What it gives up: httpcore's exceptions are mapped to httpx2's coarsely (timeouts,
connect, read/write, protocol), enough for the SDK, which only reports them.

A tenant's server is untrusted, so what this client reads of it is bounded:
- it asks for `Accept-Encoding: identity`, and a reply that is compressed anyway
  is refused unread (a few KiB of gzip can inflate to gigabytes in memory);
- a reply body is counted as it streams: past `max_bytes` the read stops with an
  error. An event stream (SSE) is long-lived, so it is not counted whole: the SDK
  bounds each event to the same number (`max_sse_event_size`, sessions.py).
The refusals are httpx2 stream errors the SDK already answers cleanly: on a JSON
reply the request's result is a PARSE_ERROR naming the reason, on an event stream
the request fails with "SSE stream failed: <reason>".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpcore
import httpx
import httpx2

from apps.core import egress
from apps.core.egress import EgressRefused, HostPolicy

_EXC_MAP: tuple[tuple[type[Exception], type[httpx2.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore.ReadTimeout, httpx2.ReadTimeout),
    (httpcore.WriteTimeout, httpx2.WriteTimeout),
    (httpcore.PoolTimeout, httpx2.PoolTimeout),
    (httpcore.TimeoutException, httpx2.TimeoutException),
    (httpcore.ConnectError, httpx2.ConnectError),
    (httpcore.ReadError, httpx2.ReadError),
    (httpcore.WriteError, httpx2.WriteError),
    (httpcore.NetworkError, httpx2.NetworkError),
    (httpcore.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore.ProtocolError, httpx2.ProtocolError),
)


@contextmanager
def _mapped() -> Iterator[None]:
    """httpcore's exceptions (and a refusal at dial time) as httpx2's, which the SDK handles."""
    try:
        yield
    except EgressRefused as exc:
        raise httpx2.ConnectError(exc.reason) from exc
    except Exception as exc:
        for source, target in _EXC_MAP:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


IDENTITY = ("", "identity")


class ReplyRefused(httpx2.StreamError):
    """A JSON reply this client will not read (compressed, or over the byte cap)."""


class EventStreamRefused(httpx2.SSEError):
    """The same for a reply that is an event stream."""


def _refusal(sse: bool, reason: str) -> Exception:
    return EventStreamRefused(reason) if sse else ReplyRefused(reason)


class _Body(httpx2.AsyncByteStream):
    """The reply's bytes, counted (not an event stream's: see the module docstring);
    `refused` set: none, the first read raises it."""

    def __init__(self, inner: httpcore.Response, *, max_bytes: int, sse: bool, refused: str = "") -> None:
        self._inner, self._max, self._sse, self._refused = inner, max_bytes, sse, refused

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refused:
            raise _refusal(self._sse, self._refused)
        seen = 0
        with _mapped():
            async for part in self._inner.aiter_stream():
                seen += len(part)
                if seen > self._max and not self._sse:
                    raise _refusal(self._sse, f"the MCP server's reply exceeds {self._max} bytes")
                yield part

    async def aclose(self) -> None:
        await self._inner.aclose()


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    return next((v.decode("latin-1").strip().lower() for k, v in headers if k.lower() == name), "")


class GuardedTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that lets a request out only as apps.core.egress allows."""

    def __init__(self, policy: HostPolicy, max_bytes: int) -> None:
        self._policy, self._max = policy, max_bytes
        self._pool = egress.async_pool(policy)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            egress.check_url(httpx.URL(str(request.url)), self._policy)
        except EgressRefused as exc:
            raise httpx2.ConnectError(exc.reason, request=request) from exc
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,  # an async byte iterable, as httpcore takes
            extensions=request.extensions,
        )
        with _mapped():
            resp = await self._pool.handle_async_request(core)
        sse = _header(resp.headers, b"content-type").startswith("text/event-stream")
        encoding = _header(resp.headers, b"content-encoding")
        headers, refused = resp.headers, ""
        if encoding not in IDENTITY:  # never handed to httpx2's decoder: the bytes are not read at all
            headers = [(k, v) for k, v in resp.headers if k.lower() != b"content-encoding"]
            refused = f"the MCP server sent a {encoding!r}-encoded reply; this client accepts identity only"
        body = _Body(resp, max_bytes=self._max, sse=sse, refused=refused)
        return httpx2.Response(resp.status, headers=headers, stream=body, extensions=resp.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()


def guarded_client(policy: HostPolicy, headers: dict[str, str], timeout: float, max_bytes: int) -> httpx2.AsyncClient:
    """The client the SDK's `streamable_http_client` gets: the server's headers on every
    request (but Accept-Encoding, always identity), the guard under every connection,
    replies bounded to `max_bytes`, the SDK's own read timeout for streams."""
    sent = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"} | {"accept-encoding": "identity"}
    return httpx2.AsyncClient(
        transport=GuardedTransport(policy, max_bytes),
        headers=sent,
        timeout=httpx2.Timeout(timeout, read=max(timeout, 300.0)),
        trust_env=False,
    )
