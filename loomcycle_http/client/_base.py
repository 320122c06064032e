"""What the sync and async clients share: configuration, the request of each operation
(`Call`), and the bookkeeping of a followed stream (`Cursor`).

Invariants:
- An operation is described once, as a `Call` (method, path, body, query); the two
  clients only send it. Path parts a caller supplies are percent-quoted (`/` kept where the
  API takes a multi-segment name: channel names, memory keys).
- A `Cursor` yields each persisted event once: the `agent` and `session` frames that open
  every stream are yielded the first time they arrive (whichever stream brings them), and
  after a reconnect any seq already passed is skipped.
- A `Reconnect` bounds how long a followed stream may stay away: its clock starts at the
  first failure since a stream last delivered a frame, so each drop gets the full timeout.
  With a `deadline` it also bounds the whole follow: no wait (back-off, headers, a frame)
  runs past it by more than MIN_READ_TIMEOUT_S, and once it has passed nothing more is read.
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from loomcycle_http.client.errors import ConnectionFailed, FollowTimeout, LoomcycleError
from loomcycle_http.client.events import Event, RunRef
from loomcycle_http.client.live import LiveText

DEFAULT_URL = "http://127.0.0.1:8787"
RECONNECT_TIMEOUT_S = 60.0  # how long a followed stream keeps trying to come back
STREAM_READ_TIMEOUT_S = 60.0  # silence longer than this (keepalives come every 20 s) is a dropped connection
MIN_READ_TIMEOUT_S = 2.0  # a follow with a deadline never waits less for headers or a frame, however near it
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.1, 2.0
RETRYABLE_STATUSES = frozenset({502, 503, 504})  # a restarting web process or proxy, while reconnecting


@dataclass(frozen=True)
class Retries:
    """How a request answered 429 or 503 is retried, as the openai and anthropic SDKs do.

    At most `max_retries` more attempts (0: none); before each, the server's `Retry-After`
    (seconds) when it sent one, else an exponential back-off from `backoff_s` with full jitter;
    either capped at `max_wait_s`. A 429/503 is the server refusing before doing the work (a
    quota, a full queue, a paused runtime, a database restart), so every method is retried."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_wait_s: float = 30.0
    statuses: frozenset[int] = frozenset({429, 503})

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number `attempt` (0-based), or None: give up."""
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return min(self.max_wait_s, max(0.0, retry_after))
        return min(self.max_wait_s, random.uniform(0, self.backoff_s * 2**attempt))


F = TypeVar("F", bound=Callable[..., Any])
OPS_ATTR = "__loomcycle_ops__"


def op(*operation_ids: str) -> Callable[[F], F]:
    """Mark a client method with the OpenAPI operation ids (/v1/openapi.json) it calls, so
    tests/cli/test_client_surface.py can tell an operation no method reaches."""

    def mark(method: F) -> F:
        setattr(method, OPS_ATTR, operation_ids)
        return method

    return mark


def base_url(url: str | None) -> str:
    return (url or os.environ.get("LOOMCYCLE_URL") or DEFAULT_URL).rstrip("/")


def auth_headers(token: str | None) -> dict[str, str]:
    """The bearer (the argument, else LOOMCYCLE_TOKEN); none in open mode."""
    value = token if token is not None else os.environ.get("LOOMCYCLE_TOKEN", "")
    return {"authorization": f"Bearer {value}"} if value else {}


def seg(value: str, *, slashes: bool = False) -> str:
    """One path part, quoted; `slashes` keeps `/` for multi-segment names."""
    return quote(value, safe="/" if slashes else "")


def new_agent_id() -> str:
    """A client-made handle in the server's format, so a run is findable before its stream names it."""
    return f"a_{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Call:
    """One HTTP operation of the API."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None


def backoff(attempt: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt))


@dataclass
class Cursor:
    """Where a followed run stands: its ids, the last seq seen, whether it ended."""

    run_id: str = ""
    agent_id: str = ""
    last_seq: int = 0
    finished: bool = False
    opened: int = 0  # streams opened so far (a 502/503/504 on a re-attach is a drop, not a refusal)
    seen: set[str] = field(default_factory=set)  # the live-only frames (`agent`, `session`) already yielded
    live: LiveText = field(default_factory=LiveText)  # the live text the caller has (across re-attaches)
    live_frames: bool = True  # False: ask for committed events only (`?live=false`)
    until_input: bool = False  # True: an `awaiting_input` event ends the follow too (an interactive run's turn)

    def accept(self, event: Event) -> bool:
        """Whether to hand `event` to the caller (and note it)."""
        if event.type == "agent":
            self.run_id = self.run_id or str(event.data.get("run_id") or "")
            self.agent_id = self.agent_id or str(event.data.get("agent_id") or "")
        if event.type in ("agent", "session"):
            first = event.type not in self.seen
            self.seen.add(event.type)
            return first
        if event.seq is not None:
            if event.seq <= self.last_seq:
                return False  # replayed after a reconnect
            self.last_seq = event.seq
        self.finished = event.is_terminal or (self.until_input and event.type == "awaiting_input")
        return True

    def run_call(self) -> Call:
        """GET the followed run: by its run_id once known, else by its agent_id."""
        if self.run_id:
            return Call("GET", f"/v1/runs/{seg(self.run_id)}")
        return Call("GET", f"/v1/agents/{seg(self.agent_id)}")


def found_run_id(cursor: Cursor, run: Mapping[str, Any] | None) -> str:
    """The run_id the lookup of a followed run's agent_id found. None (a 404: the POST that
    makes the run may still be on its way) is a dropped connection: looked up again after a
    back-off, within the reconnect timeout and the deadline."""
    if run is None:
        raise ConnectionFailed(f"no run has agent_id {cursor.agent_id} yet")
    return str(run["run_id"])


class StreamLost(Exception):
    """A followed stream stayed away longer than its reconnect timeout (the client raises ConnectionFailed)."""


@dataclass
class Reconnect:
    """The pacing of a followed stream's re-opens.

    Invariant: `failing_since` and `attempt` describe only the failures since a stream last
    delivered a frame (`delivered` resets them), so the timeout bounds one outage, never the
    sum of a long stream's outages. `quiet` counts clean closes in a row that brought no new
    event; it paces re-opens of a stream the server ends without a terminal event."""

    timeout: float
    deadline: float | None = None  # time.monotonic() past which the follow ends (FollowTimeout); None: never
    failing_since: float | None = None
    attempt: int = 0
    quiet: int = 0

    @classmethod
    def of(cls, reconnect_timeout: float, timeout: float | None) -> Reconnect:
        """The pacing of a follow that may take `timeout` seconds from now in all (None: no bound)."""
        return cls(reconnect_timeout, None if timeout is None else time.monotonic() + timeout)

    def delivered(self) -> None:
        self.failing_since, self.attempt = None, 0

    @property
    def late(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def read_timeout(self) -> float:
        """How long to wait for headers or a frame: the silence that means a dropped connection,
        or less when the deadline comes first (never under MIN_READ_TIMEOUT_S)."""
        if self.deadline is None:
            return STREAM_READ_TIMEOUT_S
        return min(STREAM_READ_TIMEOUT_S, max(MIN_READ_TIMEOUT_S, self.deadline - time.monotonic()))

    def _bounded(self, wait: float) -> float:
        return wait if self.deadline is None else max(0.0, min(wait, self.deadline - time.monotonic()))

    def after_drop(self) -> float:
        """The wait before the next attempt (the follow's loop then sees a passed deadline); StreamLost
        once the outage outlasts the reconnect timeout before the deadline."""
        now = time.monotonic()
        self.failing_since = self.failing_since or now
        if now - self.failing_since > self.timeout and not self.late:
            raise StreamLost
        self.attempt += 1
        return self._bounded(backoff(self.attempt - 1))

    def after_clean_close(self, progressed: bool) -> float:
        """The wait before re-opening a stream that ended without a terminal event."""
        self.quiet = 0 if progressed else self.quiet + 1
        return self._bounded(backoff(self.quiet))

    def check(self, cursor: Cursor) -> None:
        """Raise FollowTimeout once the deadline has passed."""
        if self.late:
            raise FollowTimeout(
                f"run {cursor.run_id or cursor.agent_id or '?'} did not end within the follow's timeout",
                run_id=cursor.run_id,
                agent_id=cursor.agent_id,
                last_seq=cursor.last_seq,
            )


def drop_wait(pace: Reconnect, cursor: Cursor, exc: Exception) -> float:
    """The wait before re-attaching a followed stream that dropped with `exc`; ConnectionFailed once
    the outage has outlasted the reconnect timeout (the sync and async followers' shared step)."""
    try:
        return pace.after_drop()
    except StreamLost:
        raise ConnectionFailed(f"lost the stream of {cursor.run_id or cursor.agent_id}: {exc!r}") from exc


def run_body(agent: str, prompt: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The POST /v1/runs body, with an agent_id made here when the caller gave none."""
    body: dict[str, Any] = {"agent": agent, **{k: v for k, v in fields.items() if v is not None}}
    if prompt is not None:
        body["prompt"] = prompt
    body.setdefault("agent_id", new_agent_id())
    return body


def run_ref(body: dict[str, Any]) -> RunRef:
    return RunRef(
        agent_id=str(body.get("agent_id", "")),
        run_id=str(body.get("run_id", "")),
        session_id=str(body.get("session_id", "")),
        status=str(body.get("status", "")),
    )


def runs_list_call(status: str, agent: str | None, tenant: str | None) -> Call:
    params = {"status": status, "agent": agent, "tenant": tenant}
    return Call("GET", "/v1/runs", params={k: v for k, v in params.items() if v})


def events_call(run_id: str, from_seq: int, limit: int) -> Call:
    return Call("GET", f"/v1/runs/{seg(run_id)}/events", params={"from_seq": from_seq, "limit": limit})


def memory_key_path(scope: str, scope_id: str, key: str) -> str:
    return f"/v1/_memory/scopes/{seg(scope)}/{seg(scope_id or '-')}/keys/{seg(key, slashes=True)}"


def memory_set_call(scope: str, scope_id: str, key: str, value: Any, *, ttl_seconds: int | None, embed: bool) -> Call:
    body: dict[str, Any] = {"value": value, "embed": embed}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    return Call("PUT", memory_key_path(scope, scope_id, key), json=body)


def memory_search_call(query: str, scope: str, scope_id: str, top_k: int) -> Call:
    body = {"query": query, "scope": scope, "scope_id": scope_id, "top_k": top_k}
    return Call("POST", "/v1/_memory/search", json=body)


def channel_path(name: str, verb: str = "") -> str:
    tail = f"/{verb}" if verb else ""
    return f"/v1/_channels/{seg(name, slashes=True)}{tail}"


def channel_publish_call(name: str, payload: Any, ttl: int | None) -> Call:
    body: dict[str, Any] = {"payload": payload}
    if ttl:
        body["ttl"] = ttl
    return Call("POST", channel_path(name, "publish"), json=body)


def channel_await_call(name: str, from_cursor: str, max_messages: int, wait_ms: int) -> Call:
    body = {"channels": [name], "mode": "any", "from_cursor": from_cursor, "max_messages": max_messages}
    return Call("POST", "/v1/_channels/_await", json={**body, "wait_ms": wait_ms})


def check_apply_tenant(name: str, me: dict[str, Any]) -> None:
    """`apply` of a static yaml name by a caller in the shared tenant (open mode, the legacy
    token): there the yaml entry outranks every runtime version (SPEC 5.1), so a fork would be
    promoted yet never run. Refused before anything is written."""
    if not me.get("tenant_id"):
        raise LoomcycleError(
            f"agent {name!r} is a static yaml entry and this caller is in the shared tenant, where the yaml "
            "entry outranks any runtime version: apply it under another name, drop it from the yaml, "
            "or use a tenant's token",
            code="static_in_shared_tenant",
        )


def agent_apply_call(name: str, definition: dict[str, Any], *, static: bool, description: str) -> Call:
    """Create `name` (a new or runtime name), or fork it when it has a static yaml entry; promoted either way."""
    body = {"op": "fork" if static else "create", "name": name, "overlay": definition, "promote": True}
    if description:
        body["description"] = description
    return Call("POST", "/v1/_agentdef", json=body)


def active_row(name: str, names: Sequence[Mapping[str, Any]], versions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The active version of `name`: the promoted row of its versions, else its newest."""
    promoted = [row for row in versions if row.get("promoted")]
    if promoted:
        return promoted[0]
    active_id = next((row.get("active_def_id") for row in names if row.get("name") == name), None)
    match = [row for row in versions if active_id and row.get("def_id") == active_id]
    return match[0] if match else (versions[0] if versions else None)


def delete_run_call(run_id: str, cancel: bool) -> Call:
    return Call("DELETE", f"/v1/runs/{seg(run_id)}", params={"cancel": "true"} if cancel else None)


def batch_call(spawns: Sequence[Mapping[str, Any]], mode: str, timeout_ms: int | None) -> tuple[Call, float]:
    """POST /v1/runs:batch, and how long to wait for its answer (a join waits for every run's end)."""
    body: dict[str, Any] = {"spawns": [dict(s) for s in spawns], "mode": mode}
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    wait = 30.0 if mode == "detach" else (timeout_ms or BATCH_JOIN_DEFAULT_MS) / 1000 + 30
    return Call("POST", "/v1/runs:batch", json=body), wait


BATCH_JOIN_DEFAULT_MS = 300_000  # the server's default `timeout_ms` of a join


def user_runs_call(user_id: str, status: str) -> Call:
    return Call("GET", f"/v1/users/{seg(user_id)}/agents", params={"status": status})


def user_states_path(user_id: str, status: str | None, agent: str | None) -> tuple[str, dict[str, str]]:
    params = {k: v for k, v in {"status": status, "agent": agent}.items() if v}
    return f"/v1/users/{seg(user_id)}/agents/stream", params


def message_body(prompt: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A POST /v1/sessions/{id}/messages body: POST /v1/runs's without agent (the session's)."""
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if prompt is not None:
        body["prompt"] = prompt
    body.setdefault("agent_id", new_agent_id())
    return body


def is_keepalive(event: str, data: str) -> bool:
    """httpx-sse hands a comment-only block (a keepalive) as an empty `message`."""
    return event == "message" and not data
