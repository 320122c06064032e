"""One POST to a hook's callback URL, through the SSRF-guarded egress client.

The URL is tenant-influenced, so it goes out only through apps.core.egress
(every resolved address checked, the checked address dialled, no redirect
followed: a 3xx is a failed call). The call never starts inside a database
transaction. `timeout_ms` bounds connecting, sending, each read and the
whole reply body; the reply is at most MAX_REPLY_BYTES of JSON.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
from django.conf import settings
from django.db import connection

from apps.core import egress
from apps.triggers.hooks.types import Hook

MAX_REPLY_BYTES = 1024 * 1024
MAX_TIMEOUT_S = 60.0  # a request passes its own, smaller timeout
USER_AGENT = "loomcycle-hooks/1"


class HookCallFailed(Exception):
    """The callback did not give a usable answer; `fail_mode` decides what that means."""


_clients: dict[tuple[str, ...], httpx.Client] = {}
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """One pooled client per process (per private-host allowlist, which tests vary)."""
    private = tuple(settings.LOOMCYCLE.http_private_host_allowlist)
    with _clients_lock:
        if private not in _clients:
            policy = egress.HostPolicy(allowed=None, private_allowlist=private)
            _clients[private] = egress.client(
                policy=policy, timeout=MAX_TIMEOUT_S, max_redirects=0, follow_redirects=False
            )
        return _clients[private]


def call(hook: Hook, payload: dict[str, Any]) -> dict[str, Any]:
    """The callback's reply object ({} for a 204 or an empty 2xx body)."""
    if connection.in_atomic_block:  # a slow callback must never hold a transaction (or its locks) open
        raise RuntimeError("a hook callback was about to be made inside a database transaction")
    timeout_s = hook.timeout_ms / 1000.0
    deadline = time.monotonic() + timeout_s
    try:
        with _client().stream(
            "POST",
            hook.callback_url,
            content=json.dumps(payload).encode(),
            headers={"content-type": "application/json", "user-agent": USER_AGENT},
            timeout=timeout_s,
        ) as response:
            body = _read(response, deadline, hook.timeout_ms)
    except egress.EgressRefused as exc:
        raise HookCallFailed(f"callback refused by the egress guard: {exc.reason}") from exc
    except httpx.TimeoutException as exc:
        raise HookCallFailed(f"callback timed out after {hook.timeout_ms} ms") from exc
    except httpx.HTTPError as exc:
        raise HookCallFailed(f"callback failed: {type(exc).__name__}: {exc}") from exc
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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HookCallFailed(f"callback reply is not JSON: {exc}") from exc
    if not isinstance(reply, dict):
        raise HookCallFailed("callback reply must be a JSON object")
    return reply
