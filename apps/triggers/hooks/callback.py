"""One POST to a hook's callback URL, through the SSRF-guarded egress client.

The URL is tenant-influenced, so it goes out only through apps.core.egress
(every resolved address checked, the checked address dialled, no redirect
followed: a 3xx is a failed call), within the operator's
LOOMCYCLE_HTTP_HOST_ALLOWLIST when that is set (as a runtime-authored MCP
server is; empty, any public host). The call never starts inside a database
transaction. `timeout_ms` is a total deadline for the whole call: every
connect, write and read on the socket waits at most what is left of it
(`_DeadlineBackend`), so a server trickling its headers or body a byte at a
time cannot hold the tool thread past it. The reply is at most
MAX_REPLY_BYTES of JSON whose strings the store can keep; anything else,
including a parse that raises (a 5000-digit integer, deep nesting), is a
failed call. The client keeps no cookies: one tenant's callback cannot set
a cookie another tenant's callback is sent.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterable
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpcore
import httpx
from django.conf import settings
from django.db import connection

from apps.core import egress
from apps.core.errors import Invalid
from apps.core.http import check_storable
from apps.triggers.hooks.types import Hook

MAX_REPLY_BYTES = 1024 * 1024
MAX_TIMEOUT_S = 60.0  # a request passes its own, smaller timeout
USER_AGENT = "loomcycle-hooks/1"


class HookCallFailed(Exception):
    """The callback did not give a usable answer; `fail_mode` decides what that means."""


_clients: dict[tuple[tuple[str, ...] | None, tuple[str, ...]], httpx.Client] = {}
_clients_lock = threading.Lock()
_deadline = threading.local()  # .at: the monotonic deadline of the call this thread is making


def _left(timeout: float | None) -> float:
    """`timeout` capped by what is left of this thread's call deadline; ReadTimeout once it passed."""
    at: float | None = getattr(_deadline, "at", None)
    if at is None:
        return MAX_TIMEOUT_S if timeout is None else timeout
    left = at - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("hook callback deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every wait is capped by the calling thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _no_cookies() -> CookieJar:
    """A jar that neither stores nor returns any cookie."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def callback_policy() -> egress.HostPolicy:
    """Where a callback may go: the operator's host allowlist when set, else any
    public host; non-public addresses only for the private-host allowlist."""
    allowed = tuple(settings.LOOMCYCLE.http_host_allowlist) or None
    return egress.operator_policy(allowed)


def _client() -> httpx.Client:
    """One pooled client per process (per host policy, which tests vary)."""
    policy = callback_policy()
    key = (policy.allowed, policy.private_allowlist)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = egress.client(
                policy=policy,
                timeout=MAX_TIMEOUT_S,
                max_redirects=0,
                follow_redirects=False,
                backend=_DeadlineBackend(httpcore.SyncBackend()),
                cookies=_no_cookies(),
            )
        return _clients[key]


def call(hook: Hook, payload: dict[str, Any], chain_deadline: float | None = None) -> dict[str, Any]:
    """The callback's reply object ({} for a 204 or an empty 2xx body). The call
    ends by `timeout_ms` or by `chain_deadline` (monotonic), whichever is first."""
    if connection.in_atomic_block:  # a slow callback must never hold a transaction (or its locks) open
        raise RuntimeError("a hook callback was about to be made inside a database transaction")
    timeout_s = hook.timeout_ms / 1000.0
    deadline = time.monotonic() + timeout_s
    limit_ms = hook.timeout_ms
    if chain_deadline is not None and chain_deadline < deadline:
        if chain_deadline <= time.monotonic():
            raise HookCallFailed("the hook chain budget (LOOMCYCLE_HOOKS_CHAIN_BUDGET_MS) is spent: not called")
        deadline, timeout_s = chain_deadline, chain_deadline - time.monotonic()
    limit_ms = round(timeout_s * 1000)
    _deadline.at = deadline
    try:
        with _client().stream(
            "POST",
            hook.callback_url,
            content=json.dumps(payload).encode(),
            headers={"content-type": "application/json", "user-agent": USER_AGENT},
            timeout=timeout_s,
        ) as response:
            body = _read(response, deadline, limit_ms)
    except egress.EgressRefused as exc:
        raise HookCallFailed(f"callback refused by the egress guard: {exc.reason}") from exc
    except (httpx.TimeoutException, httpcore.TimeoutException) as exc:
        raise HookCallFailed(f"callback timed out after {limit_ms} ms") from exc
    except httpx.HTTPError as exc:
        raise HookCallFailed(f"callback failed: {type(exc).__name__}: {exc}") from exc
    finally:
        _deadline.at = None
    return _reply(response.status_code, body)


def _read(response: httpx.Response, deadline: float, timeout_ms: int) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise HookCallFailed(f"callback reply exceeds {MAX_REPLY_BYTES} bytes")
        if time.monotonic() > deadline:
            raise HookCallFailed(f"callback timed out after {timeout_ms} ms")
        chunks.append(chunk)
    if time.monotonic() > deadline:  # headers (and an empty body) that came too late
        raise HookCallFailed(f"callback timed out after {timeout_ms} ms")
    return b"".join(chunks)


def _reply(status: int, body: bytes) -> dict[str, Any]:
    if not 200 <= status < 300:
        raise HookCallFailed(f"callback answered HTTP {status}")
    if status == 204 or not body.strip():
        return {}
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 4300+ digit integer
        raise HookCallFailed(f"callback reply is not usable JSON: {type(exc).__name__}") from exc
    if not isinstance(reply, dict):
        raise HookCallFailed("callback reply must be a JSON object")
    try:
        check_storable(reply)  # no NUL, no lone surrogate, bounded depth: it is stored with the step
    except Invalid as exc:
        raise HookCallFailed(f"callback reply cannot be stored: {exc.message}") from exc
    return reply
