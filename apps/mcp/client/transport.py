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


class _Body(httpx2.AsyncByteStream):
    def __init__(self, inner: httpcore.Response) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped():
            async for part in self._inner.aiter_stream():
                yield part

    async def aclose(self) -> None:
        await self._inner.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that lets a request out only as apps.core.egress allows."""

    def __init__(self, policy: HostPolicy) -> None:
        self._policy = policy
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
        return httpx2.Response(resp.status, headers=resp.headers, stream=_Body(resp), extensions=resp.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()


def guarded_client(policy: HostPolicy, headers: dict[str, str], timeout: float) -> httpx2.AsyncClient:
    """The client the SDK's `streamable_http_client` gets: the server's headers on every
    request, the guard under every connection, the SDK's own read timeout for streams."""
    return httpx2.AsyncClient(
        transport=GuardedTransport(policy),
        headers=headers,
        timeout=httpx2.Timeout(timeout, read=max(timeout, 300.0)),
        trust_env=False,
    )
