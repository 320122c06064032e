"""The SSRF guard (SPEC 8): every outbound HTTP call a tenant can influence
goes through `client()` / `async_client()` / `async_pool()`: the HTTP and
WebFetch tools, tool-use hook callbacks, the MCP client and prompt images given
by URL (apps.gateway.images). Host-list matching lives in apps.core.hosts.

Invariants, per connection and so per redirect hop (httpx calls the transport
once per hop, and the pool opens a connection per origin):

- the URL's host must match `HostPolicy.allowed` (a dot-boundary suffix match,
  trailing dot ignored, `*` any host; `()` refuses every host before any
  resolution or byte);
- the host is resolved once, and unless it is in the private allowlist every
  address must be globally routable: loopback, RFC 1918, shared (100.64/10),
  ULA, link-local (169.254.169.254 included), multicast, unspecified, reserved
  and documentation ranges are refused, also when they hide inside IPv4-mapped,
  6to4 or Teredo IPv6 addresses;
- the TCP connection goes to an address that was checked (never to the name
  again), so a DNS answer that changes between check and connect (rebinding)
  cannot redirect it; TLS SNI, certificate checking and the Host header keep
  the name, because httpcore hands the origin's name to `start_tls` and the
  request carries its own Host header.

The seam is httpcore's public network-backend interface (`NetworkBackend`,
`AsyncNetworkBackend`): httpx's own `HTTPTransport` takes no backend, so this
module has a small transport of its own over `httpcore.ConnectionPool`, with
the same request/response conversion and exception mapping httpx uses (the
mapping is restated here rather than imported from httpx's private module).
Environment proxies are off (`trust_env=False`): a proxy would do the
resolving and connecting, out of the guard's reach.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import typing
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import httpcore
import httpx
from django.conf import settings

from apps.core.hosts import host_matches, normalise_host

Resolver = Callable[[str, int], Sequence[str]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_PRIVATE_HINT = "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST"
# Replace the transport, or configure httpx's default transport (which is not used here).
_FORBIDDEN_KW = frozenset({"transport", "mounts", "proxy", "trust_env", "cert", "http1", "http2", "limits"})
Verify = ssl.SSLContext | str | bool


class EgressRefused(Exception):
    """An outbound request the guard refused before sending any byte; `reason` is for humans."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class HostPolicy:
    """Where a client may connect. `allowed`: None = any public host, `()` = none,
    else entries matched by `host_matches`. `private_allowlist`: hosts that may
    resolve to non-public addresses (same matching)."""

    allowed: tuple[str, ...] | None
    private_allowlist: tuple[str, ...] = ()


def operator_policy(allowed: tuple[str, ...] | None) -> HostPolicy:
    """A policy with the operator's private allowlist (`LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST`)."""
    return HostPolicy(allowed=allowed, private_allowlist=tuple(settings.LOOMCYCLE.http_private_host_allowlist))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped, 6to4, Teredo's client), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def address_refusal(ip: IPAddress) -> str | None:
    """Why an address may not be dialled (the range's name), or None for a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            why = address_refusal(inner)
            return f"{why}, inside {ip}" if why else None
    checks: tuple[tuple[bool, str], ...] = (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED_V4, "shared address space (RFC 6598)"),
        (isinstance(ip, ipaddress.IPv6Address) and ip in _ULA, "unique local (ULA)"),
        (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local, "site-local (fec0::/10, deprecated)"),
        (ip.is_private, "private (RFC 1918 or special-purpose)"),
        (ip.is_reserved, "reserved"),
        (not ip.is_global, "not globally routable"),
    )
    return next((name for refused, name in checks if refused), None)


_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")
_ULA = ipaddress.IPv6Network("fc00::/7")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address getaddrinfo gives for a TCP connection to host:port, in its order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check_addresses(host: str, addresses: Sequence[str], policy: HostPolicy) -> list[str]:
    """The addresses to dial for `host`: all of them when the host is in the
    private allowlist, else all of them provided every one is public (one
    non-public answer refuses the host: a mixed answer is a rebinding tell)."""
    if not addresses:
        raise httpcore.ConnectError(f"{host!r} resolved to no address")
    if host_matches(host, policy.private_allowlist):
        return list(addresses)
    for text in addresses:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        why = address_refusal(ip)
        if why:
            raise EgressRefused(
                f"host {normalise_host(host)!r} resolves to {ip}, a {why} address; "
                f"outbound requests to non-public addresses are refused unless the host is in {_PRIVATE_HINT}"
            )
    return list(addresses)


def check_url(url: httpx.URL, policy: HostPolicy) -> None:
    """The name-level checks, before anything is resolved or sent."""
    if url.scheme not in ("http", "https"):
        raise EgressRefused(f"url scheme {url.scheme!r} is refused: only http and https are allowed")
    host = normalise_host(url.raw_host.decode("ascii"))  # IDNA names as resolved: punycode
    if not host:
        raise EgressRefused("url has no host")
    if policy.allowed is None:
        return
    if not policy.allowed:
        raise EgressRefused("no outbound network access is allowed here (the allowed host list is empty)")
    if not host_matches(host, policy.allowed):
        raise EgressRefused(f"host {host!r} is not in the allowed hosts ({', '.join(policy.allowed)})")


class _GuardedBackend(httpcore.NetworkBackend):
    """Resolve, check, then connect to a checked address (see the module docstring)."""

    def __init__(self, policy: HostPolicy, resolver: Resolver, inner: httpcore.NetworkBackend) -> None:
        self._policy, self._resolver, self._inner = policy, resolver, inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = check_addresses(host, self._resolver(host, port), self._policy)
        error: Exception | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        raise EgressRefused("unix sockets are refused")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncGuardedBackend(httpcore.AsyncNetworkBackend):
    """The async twin of _GuardedBackend; the resolver runs on a worker thread."""

    def __init__(self, policy: HostPolicy, resolver: Resolver, inner: httpcore.AsyncNetworkBackend) -> None:
        self._policy, self._resolver, self._inner = policy, resolver, inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        answers = await anyio.to_thread.run_sync(self._resolver, host, port)
        addresses = check_addresses(host, answers, self._policy)
        error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("unix sockets are refused")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_EXC_MAP: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    # Most specific first: the first match wins.
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """httpcore's exceptions as httpx's, as httpx's own transport does; others pass through."""
    try:
        yield
    except Exception as exc:
        for source, target in _EXC_MAP:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


def _core_request(request: httpx.Request) -> httpcore.Request:
    url = httpcore.URL(
        scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port, target=request.url.raw_path
    )
    return httpcore.Request(
        method=request.method,
        url=url,
        headers=request.headers.raw,
        content=request.stream,
        extensions=request.extensions,
    )


class _Stream(httpx.SyncByteStream):
    def __init__(self, inner: Iterable[bytes]) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        with _mapped_errors():
            yield from self._inner

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: typing.AsyncIterable[bytes]) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped_errors():
            async for part in self._inner:
                yield part

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class GuardedTransport(httpx.BaseTransport):
    """httpx transport: the name check, then httpcore's pool over the guarded backend."""

    def __init__(
        self,
        policy: HostPolicy,
        *,
        resolver: Resolver | None = None,
        backend: httpcore.NetworkBackend | None = None,
        verify: Verify = True,
    ) -> None:
        self._policy = policy
        guarded = _GuardedBackend(policy, resolver or system_resolver, backend or httpcore.SyncBackend())
        ssl_context = httpx.create_ssl_context(verify=verify)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=guarded)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        check_url(request.url, self._policy)
        with _mapped_errors():
            resp = self._pool.handle_request(_core_request(request))
        assert isinstance(resp.stream, Iterable)
        return httpx.Response(
            resp.status, headers=resp.headers, stream=_Stream(resp.stream), extensions=resp.extensions
        )

    def close(self) -> None:
        self._pool.close()


class AsyncGuardedTransport(httpx.AsyncBaseTransport):
    """The async twin of GuardedTransport."""

    def __init__(
        self,
        policy: HostPolicy,
        *,
        resolver: Resolver | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
        verify: Verify = True,
    ) -> None:
        self._policy = policy
        self._pool = async_pool(policy, resolver=resolver, backend=backend, verify=verify)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        check_url(request.url, self._policy)
        with _mapped_errors():
            resp = await self._pool.handle_async_request(_core_request(request))
        assert isinstance(resp.stream, typing.AsyncIterable)
        return httpx.Response(
            resp.status, headers=resp.headers, stream=_AsyncStream(resp.stream), extensions=resp.extensions
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def async_pool(
    policy: HostPolicy,
    *,
    resolver: Resolver | None = None,
    backend: httpcore.AsyncNetworkBackend | None = None,
    verify: Verify = True,
) -> httpcore.AsyncConnectionPool:
    """httpcore's async pool over the guarded backend: every connection it opens is
    resolved, checked and dialled as the module docstring says. For HTTP stacks that
    sit on httpcore but are not httpx (the MCP SDK's httpx2); the caller still runs
    `check_url` on each request's URL before handing it to the pool."""
    guarded = _AsyncGuardedBackend(policy, resolver or system_resolver, backend or httpcore.AnyIOBackend())
    return httpcore.AsyncConnectionPool(ssl_context=httpx.create_ssl_context(verify=verify), network_backend=guarded)


def _client_kwargs(timeout: float, max_redirects: int, kw: dict[str, Any]) -> dict[str, Any]:
    clash = _FORBIDDEN_KW & set(kw)
    if clash:
        raise TypeError(f"egress clients own their transport; {sorted(clash)} cannot be passed")
    return {"timeout": timeout, "max_redirects": max_redirects, "follow_redirects": True, **kw, "trust_env": False}


def client(
    *,
    policy: HostPolicy,
    timeout: float,
    max_redirects: int = 5,
    resolver: Resolver | None = None,
    backend: httpcore.NetworkBackend | None = None,
    verify: Verify = True,
    **kw: Any,
) -> httpx.Client:
    """A guarded httpx.Client following at most `max_redirects` redirects, each hop
    checked anew. `resolver` and `backend` are seams (tests); `verify` is httpx's
    TLS verification; other keywords go to httpx.Client, except those that would
    replace or configure another transport (a TypeError, not silently ignored)."""
    transport = GuardedTransport(policy, resolver=resolver, backend=backend, verify=verify)
    return httpx.Client(transport=transport, **_client_kwargs(timeout, max_redirects, kw))


def async_client(
    *,
    policy: HostPolicy,
    timeout: float,
    max_redirects: int = 5,
    resolver: Resolver | None = None,
    backend: httpcore.AsyncNetworkBackend | None = None,
    verify: Verify = True,
    **kw: Any,
) -> httpx.AsyncClient:
    """The async twin of `client`."""
    transport = AsyncGuardedTransport(policy, resolver=resolver, backend=backend, verify=verify)
    return httpx.AsyncClient(transport=transport, **_client_kwargs(timeout, max_redirects, kw))
