"""The HTTP transport every real driver shares.

A driver is a `WireProtocol`: pure translation, no I/O. It builds the
request (`build`) and decodes the response frames (`decoder`); `HttpProvider`
does the I/O twice over the same protocol object: blocking (`stream`, worker
threads, honours a cancel Event) and async (`astream`, the web's event loop).

Framing: "sse" (`event:`/`data:` lines, blank-line dispatch, `:` comments), parsed by
httpx-sse, the parser of loomcycle_http.client's run streams too (one SSE parser in the
project), or "ndjson" (one JSON document per line). Errors: a 4xx/5xx answer becomes
`ProviderError(id, status, <provider's own message>, retry_after=...)`
(Retry-After in seconds or as an HTTP date, or `retry-after-ms`); connect
failures, timeouts and broken streams become status 0 (retryable); a frame
that does not parse becomes 502 (retryable: the next attempt may be fine).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar
from weakref import WeakKeyDictionary

import httpx
from httpx_sse import EventSource, ServerSentEvent

from apps.gateway.providers.base import (
    Capabilities,
    Provider,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
)

log = logging.getLogger("loomcycle.gateway")

MAX_ERROR_BODY = 64 * 1024


@dataclass(frozen=True)
class ProviderConfig:
    """One configured provider: built-in (from env keys) or a yaml `providers:` entry."""

    id: str
    driver: str  # anthropic | openai | gemini | ollama
    base_url: str
    api_key: str | None = None
    dialect: str = ""  # openai driver: "openai" | "deepseek" | "compat"
    local: bool = False  # a local server: long first-byte timeout, no key needed
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    max_concurrent: int = 0  # 0 = no per-provider gate
    options: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)  # overrides of the protocol's defaults


@dataclass(frozen=True)
class HttpCall:
    url: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class Frame:
    """One SSE event (`event` may be "") or one NDJSON line (`event` is "")."""

    event: str
    data: str


class Decoder(ABC):
    """Stateful, one per call: frames in, provider events out."""

    @abstractmethod
    def feed(self, frame: Frame) -> list[ProviderEvent]:
        """Events this frame completes (often none). Raise ProviderError for an error frame."""

    @abstractmethod
    def finish(self) -> list[ProviderEvent]:
        """At end of stream: the remaining events, ending with exactly one Done;
        raise ProviderError(id, 0, ...) if the stream ended before the provider said it was done."""


class WireProtocol(ABC):
    framing: ClassVar[str]  # "sse" | "ndjson"
    capabilities: ClassVar[Capabilities]
    sampling_knobs: ClassVar[frozenset[str]]  # the ProviderRequest.sampling keys its requests carry

    @abstractmethod
    def build(self, config: ProviderConfig, request: ProviderRequest) -> HttpCall:
        """The streaming request for this provider's API."""

    @abstractmethod
    def decoder(self, config: ProviderConfig, request: ProviderRequest) -> Decoder:
        """A fresh decoder for one call."""

    def unsent_sampling(self, sampling: dict[str, Any], effort: str) -> list[str]:
        """The knobs of `sampling` this wire format has no field for (Provider.unsent_sampling)."""
        return sorted(k for k, v in sampling.items() if v is not None and k not in self.sampling_knobs)

    def error_message(self, body: bytes) -> str:
        """The provider's own message from an error body (`{"error": {"message"}}` by default)."""
        try:
            doc = json.loads(body)
        except ValueError:
            return body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
        return json.dumps(doc)[:500]


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """`retry-after-ms`, else `Retry-After` as seconds or an HTTP date; None when absent/invalid."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            log.debug("ignoring a non-numeric retry-after-ms header: %r", raw_ms)
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.debug("Retry-After %r is not seconds; trying it as an HTTP date", raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_json(provider_id: str, data: str) -> Any:
    """A frame's JSON payload; a malformed one is a 502 ProviderError."""
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProviderError(provider_id, 502, f"malformed stream frame: {data[:200]!r}") from exc


def _frame(sse: ServerSentEvent) -> Frame | None:
    """httpx-sse names an event sent without `event:` "message", and hands a block of only
    comments as an empty event once the stream sent an `id:`: neither is a provider's frame."""
    event = "" if sse.event == "message" else sse.event
    return Frame(event, sse.data) if event or sse.data else None


def frames(framing: str, response: httpx.Response) -> Iterator[Frame]:
    """The response's frames as they arrive. A body that is not `text/event-stream` where SSE is
    expected raises httpx-sse's SSEError (an httpx.TransportError: a retryable status 0)."""
    if framing == "ndjson":
        yield from (Frame("", line) for line in response.iter_lines() if line.strip())
        return
    for sse in EventSource(response).iter_sse():
        frame = _frame(sse)
        if frame is not None:
            yield frame


async def aframes(framing: str, response: httpx.Response) -> AsyncIterator[Frame]:
    """`frames`, read asynchronously."""
    if framing == "ndjson":
        async for line in response.aiter_lines():
            if line.strip():
                yield Frame("", line)
        return
    async for sse in EventSource(response).aiter_sse():
        frame = _frame(sse)
        if frame is not None:
            yield frame


class HttpProvider(Provider):
    """A provider over HTTP: one `ProviderConfig`, one `WireProtocol`."""

    def __init__(self, config: ProviderConfig, protocol: WireProtocol) -> None:
        self.id = config.id
        self.config = config
        self.protocol = protocol
        caps = {**protocol.capabilities.__dict__, **config.capabilities}
        self.capabilities = Capabilities(**{k: v for k, v in caps.items() if k in Capabilities.__dataclass_fields__})
        self._timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self._client: httpx.Client | None = None
        self._aclients: WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = WeakKeyDictionary()
        self._lock = threading.Lock()

    def unsent_sampling(self, sampling: dict[str, Any], effort: str) -> list[str]:
        return self.protocol.unsent_sampling(sampling, effort)

    # --- clients (pooled; the async one per event loop) -------------------------

    def client(self) -> httpx.Client:
        """Pooled, except for a local provider: every call there opens its own
        connection, so a cancel can cut it even before the response headers
        (a local server may hold them back while it loads the model)."""
        with self._lock:
            if self._client is None:
                keepalive = 0 if self.config.local else None
                limits = httpx.Limits(max_connections=1000, max_keepalive_connections=keepalive)
                self._client = httpx.Client(timeout=self._timeout, limits=limits)
            return self._client

    def aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        found = self._aclients.get(loop)
        if found is None:
            found = httpx.AsyncClient(timeout=self._timeout, limits=httpx.Limits(max_connections=1000))
            self._aclients[loop] = found
        return found

    # --- blocking ---------------------------------------------------------------

    def stream(self, request: ProviderRequest, cancel: threading.Event) -> Iterator[ProviderEvent]:
        if cancel.is_set():
            raise ProviderCancelled()
        call = self.protocol.build(self.config, request)
        decoder = self.protocol.decoder(self.config, request)
        try:
            with _WATCHER.watch(cancel) as conn:
                extensions = {"trace": conn.trace}
                with self.client().stream(
                    "POST", call.url, headers=call.headers, json=call.body, extensions=extensions
                ) as response:
                    conn.stream = response.extensions.get("network_stream", conn.stream)
                    if response.status_code >= 400:
                        body = response.read()[:MAX_ERROR_BODY]
                        raise self._http_error(response, body)
                    for frame in frames(self.protocol.framing, response):
                        if cancel.is_set():
                            raise ProviderCancelled()
                        yield from decoder.feed(frame)
                    if cancel.is_set():  # the watcher cut the connection
                        raise ProviderCancelled()
            yield from decoder.finish()
        except (httpx.HTTPError, httpx.StreamError) as exc:
            if cancel.is_set():
                raise ProviderCancelled() from exc
            raise self._transport_error(exc) from exc

    # --- async ------------------------------------------------------------------

    async def astream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        call = self.protocol.build(self.config, request)
        decoder = self.protocol.decoder(self.config, request)
        try:
            async with self.aclient().stream("POST", call.url, headers=call.headers, json=call.body) as response:
                if response.status_code >= 400:
                    body = (await response.aread())[:MAX_ERROR_BODY]
                    raise self._http_error(response, body)
                async for frame in aframes(self.protocol.framing, response):
                    for event in decoder.feed(frame):
                        yield event
            for event in decoder.finish():
                yield event
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise self._transport_error(exc) from exc

    # --- errors -----------------------------------------------------------------

    def _http_error(self, response: httpx.Response, body: bytes) -> ProviderError:
        message = self.protocol.error_message(body)
        return ProviderError(self.id, response.status_code, message, retry_after=retry_after_seconds(response.headers))

    def _transport_error(self, exc: Exception) -> ProviderError:
        if isinstance(exc, httpx.TimeoutException):
            kind = "timed out" + (" waiting for the first byte" if isinstance(exc, httpx.ReadTimeout) else "")
            return ProviderError(self.id, 0, f"{kind} ({type(exc).__name__})")
        return ProviderError(self.id, 0, f"{type(exc).__name__}: {exc}")


class _Conn:
    """The network stream of one blocking call, as soon as it is known: from
    the connect trace (a new connection, before any byte is sent) or from the
    response (a pooled connection, once the headers are in)."""

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel
        self.stream: Any = None

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            self.stream = info.get("return_value")

    def cut(self) -> None:
        sock = self.stream.get_extra_info("socket") if self.stream is not None else None
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # the reader closed it first: nothing left to unblock
            log.debug("cancel: socket already closed (%s)", exc)


class _CancelWatcher:
    """One thread per process that cuts the connection of every blocking call
    whose cancel Event fired (shutting the socket down unblocks a read that
    may otherwise wait minutes for a slow or local model's first byte)."""

    INTERVAL_S = 0.05

    def __init__(self) -> None:
        self._calls: dict[int, _Conn] = {}
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._next = 0

    @contextmanager
    def watch(self, cancel: threading.Event) -> Iterator[_Conn]:
        conn = _Conn(cancel)
        with self._lock:
            self._next += 1
            key = self._next
            self._calls[key] = conn
            self._lock.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="provider-cancel-watcher", daemon=True)
                self._thread.start()
        try:
            yield conn
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._calls:  # idle: sleep until a call is watched, not every interval
                    self._lock.wait()
                self._lock.wait(self.INTERVAL_S)
                fired = [c for c in self._calls.values() if c.cancel.is_set() and c.stream is not None]
            for conn in fired:
                conn.cut()


_WATCHER = _CancelWatcher()
