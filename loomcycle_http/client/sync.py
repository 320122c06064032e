"""The synchronous client: `Client(url, token)`, one attribute per resource of the API (`runs`
here; the others in their own modules, docs/client.md). Every refusal raises a typed `ApiError`;
run streams reconnect from the last seq they saw (see `Runs.stream`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import httpx
from httpx_sse import EventSource

from loomcycle_http.client import _base as b
from loomcycle_http.client.agents import Agents
from loomcycle_http.client.budgets import Budgets
from loomcycle_http.client.channels import Channels
from loomcycle_http.client.config import Config
from loomcycle_http.client.defs import Defs
from loomcycle_http.client.errors import ApiError, ConnectionFailed, NotFound, error_from_response
from loomcycle_http.client.events import TERMINAL_STATES, Event, RunRef, event_from_sse
from loomcycle_http.client.gateway import Gateway
from loomcycle_http.client.lifecycle import Erasure, Retention
from loomcycle_http.client.memory import Memory
from loomcycle_http.client.pages import RUNS_PAGE, children_query, paged, runs_query
from loomcycle_http.client.runtime import Runtime
from loomcycle_http.client.sessions import Interrupts, Sessions
from loomcycle_http.client.snapshots import Snapshots
from loomcycle_http.client.tokens import Tokens, Volumes
from loomcycle_http.client.triggers import Hooks, Schedules, Webhooks
from loomcycle_http.client.types import Run

JsonList = list[Any]  # (an alias: `list` is also a method name in the classes below)
_DROPPED = (httpx.TransportError, ConnectionFailed)
_Opener = Callable[[], AbstractContextManager[httpx.Response]]


class Client:
    """A connection to one runtime. `url` defaults to LOOMCYCLE_URL (else
    http://127.0.0.1:8787), `token` to LOOMCYCLE_TOKEN. Use it as a context manager,
    or call `close()`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: b.Retries | None = None,
        **httpx_kwargs: Any,
    ) -> None:
        self.url = b.base_url(url)
        self.retries = retries or b.Retries()  # 429/503: Retries(max_retries=0) turns retrying off
        self.http = httpx.Client(base_url=self.url, headers=b.auth_headers(token), timeout=timeout, **httpx_kwargs)
        self.runs = Runs(self)
        self.agents = Agents(self)  # the def kinds (loomcycle_http.client.defs)
        self.skills, self.mcp_servers = Defs(self, "skill"), Defs(self, "mcpserver")
        self.schedule_defs, self.webhook_defs = Defs(self, "schedule"), Defs(self, "webhook")
        self.a2a_server_cards, self.a2a_agents = Defs(self, "a2aservercard"), Defs(self, "a2aagent")
        self.volumes, self.tokens = Volumes(self), Tokens(self)
        self.memory = Memory(self)
        self.channels = Channels(self)
        self.runtime = Runtime(self)  # pause, /v1/_me, concurrency
        self.budgets = Budgets(self)  # limits and usage
        self.sessions = Sessions(self)  # conversations
        self.interrupts = Interrupts(self)
        self.snapshots = Snapshots(self)  # admin
        self.hooks, self.schedules, self.webhooks = Hooks(self), Schedules(self), Webhooks(self)
        self.retention, self.erasure = Retention(self), Erasure(self)
        self.gateway = Gateway(self)  # model calls without a run
        self.config = Config(self)  # presets and the env template (admin)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def send(self, call: b.Call, *, timeout: float | None = None) -> Any:
        """Send `call`; its JSON answer (None for 204), or the typed error (429/503 after `retries`)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        attempt = 0
        while True:
            try:
                resp = self.http.request(call.method, call.path, json=call.json, params=call.params, **extra)
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"{call.method} {self.url}{call.path}: {exc!r}") from exc
            if resp.status_code < 400:
                return None if resp.status_code == 204 or not resp.content else resp.json()
            error = error_from_response(resp)
            wait = self.retries.wait(attempt, error.retry_after) if resp.status_code in self.retries.statuses else None
            if wait is None:
                raise error
            attempt += 1
            time.sleep(wait)


class Runs:
    """Runs: start, follow, read, steer and cancel them."""

    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("runs_create")
    def create(self, agent: str, prompt: str | None = None, **fields: Any) -> RunRef:
        """Start a run in the background (POST /v1/runs, `background: true`); its handles."""
        body = b.run_body(agent, prompt, {**fields, "background": True})
        return b.run_ref(self._c.send(b.Call("POST", "/v1/runs", json=body)))

    @b.op("runs_create")
    def start(
        self,
        agent: str,
        prompt: str | None = None,
        *,
        reconnect_timeout: float = b.RECONNECT_TIMEOUT_S,
        timeout: float | None = None,
        until_input: bool = False,
        **fields: Any,
    ) -> Iterator[Event]:
        """Start a run and stream its events (POST /v1/runs, SSE) to the end. The run
        gets a client-made `agent_id` unless `fields` has one, so a stream that drops
        before it named the run still finds it. A refusal raises before the first event.
        `timeout` and `until_input` as for `stream`."""
        body = b.run_body(agent, prompt, fields)
        return self.follow_post("/v1/runs", body, reconnect_timeout, timeout=timeout, until_input=until_input)

    def follow_post(
        self,
        path: str,
        body: dict[str, Any],
        reconnect_timeout: float,
        *,
        timeout: float | None = None,
        until_input: bool = False,
    ) -> Iterator[Event]:
        """POST `body` (which names its run by `agent_id`) to a route answering a run's stream, and
        follow that run to its end (runs.start, sessions.message)."""
        cursor = b.Cursor(agent_id=str(body["agent_id"]), until_input=until_input)
        pace = b.Reconnect.of(reconnect_timeout, timeout)
        return self._follow(cursor, pace, first=lambda: self._post_opener(path, body, pace))

    @b.op("runs_stream")
    def stream(
        self,
        run_id: str,
        *,
        from_seq: int = 0,
        reconnect_timeout: float = b.RECONNECT_TIMEOUT_S,
        live: bool = True,
        timeout: float | None = None,
        until_input: bool = False,
    ) -> Iterator[Event]:
        """Follow a run (GET /v1/runs/{id}/stream) from after `from_seq` to its end.
        A dropped or silent connection is re-opened with `Last-Event-ID` (the last seq
        seen), so no event is lost or repeated; after `reconnect_timeout` seconds without
        getting a connection back, ConnectionFailed. `live=False`: committed events only, each
        whole (no live text and thinking frames). `timeout`: seconds the whole follow may take,
        then FollowTimeout (the run goes on). `until_input`: end after an `awaiting_input` event too."""
        cursor = b.Cursor(run_id=run_id, last_seq=from_seq, live_frames=live, until_input=until_input)
        return self._follow(cursor, b.Reconnect.of(reconnect_timeout, timeout), first=None)

    @b.op("runs_get")
    def get(self, run_id: str) -> Run:
        return cast(Run, self._c.send(b.Call("GET", f"/v1/runs/{b.seg(run_id)}")))

    @b.op("agents_get")
    def get_by_agent_id(self, agent_id: str) -> Run:
        return cast(Run, self._c.send(b.Call("GET", f"/v1/agents/{b.seg(agent_id)}")))

    def resolve(self, ref: str) -> Run:
        """A run by its run_id, else by its agent_id."""
        try:
            return self.get(ref)
        except NotFound:  # not a run_id: try it as an agent_id
            return self._by_agent_id_or_404(ref)

    def _by_agent_id_or_404(self, ref: str) -> Run:
        try:
            return self.get_by_agent_id(ref)
        except NotFound as exc:
            raise NotFound(404, "not_found", f"no run with run_id or agent_id {ref!r}", {}, None) from exc

    @b.op("runs_list")
    def list(self, *, status: str = "running", agent: str | None = None, tenant: str | None = None) -> JsonList:
        """Runs of the caller's tenant (GET /v1/runs), newest first."""
        return list(self._c.send(b.runs_list_call(status, agent, tenant))["runs"])

    @b.op("runs_list")
    def iter(self, *, status: str = "all", page_size: int = RUNS_PAGE, **filters: str | None) -> Iterator[Run]:
        """Every run matching the filters (agent, user_id, metadata, created_after/before, tenant),
        newest first, following `next_cursor` page after page (GET /v1/runs)."""
        path, key, params = runs_query(page_size, status=status, **filters)
        return cast(Iterator[Run], paged(self._c.send, path, key, params))

    @b.op("runs_children")
    def children(self, run_id: str, *, status: str = "all", page_size: int = RUNS_PAGE) -> Iterator[Run]:
        """The run's direct sub-agent runs, newest first, page after page (GET /v1/runs/{id}/children)."""
        return cast(Iterator[Run], paged(self._c.send, *children_query(run_id, status, page_size)))

    @b.op("runs_fork")
    def fork(self, run_id: str, from_step: int, **fields: Any) -> dict[str, Any]:
        """A new run in a new session from this run's transcript through `from_step` (POST .../fork;
        `agent`, `prompt`, `interactive`, `agent_id`): `{agent_id, run_id, session_id, status, ...}`."""
        body = {"from_step": from_step, **fields}
        return dict(self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/fork", json=body)))

    @b.op("runs_compact")
    def compact(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """Queue a compaction of the run's context for its next iteration (`keep_last_n`, `keep_first`)."""
        return dict(self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/compact", json=fields)))

    @b.op("runs_events")
    def events(self, run_id: str, *, from_seq: int = 0) -> Iterator[Event]:
        """Every persisted event after `from_seq`, as stored (GET /v1/runs/{id}/events, paged)."""
        while True:
            page = self._c.send(b.events_call(run_id, from_seq, 500))
            for row in page["events"]:
                from_seq = int(row["seq"])
                yield Event(type=str(row["type"]), data=dict(row["payload"]), seq=from_seq)
            if not page["events"] or from_seq >= int(page["last_seq"]):
                return

    @b.op("runs_events")
    def event_rows(self, run_id: str, *, from_seq: int = 0) -> Iterator[dict[str, Any]]:
        """Every persisted event after `from_seq` as the API returns it (`seq`, `type`,
        `payload`, `created_at`), paged; `events` is the same as `Event`s."""
        while True:
            page = self._c.send(b.events_call(run_id, from_seq, 500))
            for row in page["events"]:
                from_seq = int(row["seq"])
                yield dict(row)
            if not page["events"] or from_seq >= int(page["last_seq"]):
                return

    @b.op("agents_cancel")
    def cancel(self, agent_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a run by its agent_id (and its live sub-runs); idempotent."""
        body = {"reason": reason} if reason else {}
        return dict(self._c.send(b.Call("POST", f"/v1/agents/{b.seg(agent_id)}/cancel", json=body)))

    @b.op("runs_turn_cancel")
    def cancel_turn(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        """Turn-cancel an interactive run: stop its current model turn or tool batch and re-park it
        at `awaiting_input` (`{run_id, stopped, parked}`); 409 `not_interactive` / `not_mid_turn`."""
        body = {"reason": reason} if reason else {}
        return dict(self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/cancel", json=body)))

    @b.op("runs_input")
    def input(self, run_id: str, text: str) -> dict[str, Any]:
        """Steer a live run, or answer one parked at `awaiting_input`."""
        return dict(self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/input", json={"text": text})))

    @b.op("runs_delete")
    def delete(self, run_id: str, *, cancel: bool = False) -> dict[str, Any]:
        """Delete an ended run, its sub-runs and what is stored of them (409 `run_live` while one is live);
        `cancel=True` cancels a live tree and deletes it when it ends (`deleting: true`)."""
        return dict(self._c.send(b.delete_run_call(run_id, cancel)))

    @b.op("runs_batch")
    def batch(
        self, spawns: Sequence[dict[str, Any]], *, mode: str = "join", timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """Start up to 32 runs (POST /v1/runs:batch bodies) and wait for all (`join`), or have their
        handles at once (`detach`): `{"results": [...index-aligned...], "spawned", ...}`."""
        call, wait = b.batch_call(spawns, mode, timeout_ms)
        return dict(self._c.send(call, timeout=wait))

    @b.op("runs_webhooks")
    def webhooks(self, run_id: str) -> JsonList:
        """The run's completion-webhook deliveries (`state`, `attempts`, `last_status`, ...)."""
        return list(self._c.send(b.Call("GET", f"/v1/runs/{b.seg(run_id)}/webhooks"))["deliveries"])

    @b.op("users_agents")
    def of_user(self, user_id: str, *, status: str = "running") -> JsonList:
        """One user's runs, newest first, at most 1000 (GET /v1/users/{id}/agents)."""
        return list(self._c.send(b.user_runs_call(user_id, status))["agents"])

    @b.op("users_agents_stream")
    def watch_user(self, user_id: str, *, status: str | None = None, agent: str | None = None) -> Iterator[Event]:
        """The state changes of one user's runs as they happen: a `stream_open` event, then one `run_state`
        per change, until the server ends the stream (30 minutes at most: call again, and reconcile with
        `runs.iter`). Not resumed after a drop: the stream has no ids to resume from."""
        path, params = b.user_states_path(user_id, status, agent)
        timeout = httpx.Timeout(30.0, read=b.STREAM_READ_TIMEOUT_S)
        with self._c.http.stream("GET", path, params=params, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise error_from_response(resp)
            for sse in EventSource(resp).iter_sse():
                if not b.is_keepalive(sse.event, sse.data):
                    yield event_from_sse(sse.event, sse.data, "")

    def _post_opener(
        self, path: str, body: dict[str, Any], pace: b.Reconnect
    ) -> AbstractContextManager[httpx.Response]:
        timeout = httpx.Timeout(30.0, read=pace.read_timeout())
        return self._c.http.stream("POST", path, json=body, timeout=timeout)

    def _get_opener(self, cursor: b.Cursor, pace: b.Reconnect) -> AbstractContextManager[httpx.Response]:
        if not cursor.run_id:  # the POST's answer never named the run: find it by its handle
            cursor.run_id = b.found_run_id(cursor, self._lookup(cursor, pace))
        headers = {"Last-Event-ID": str(cursor.last_seq)}
        timeout = httpx.Timeout(30.0, read=pace.read_timeout())
        url = f"/v1/runs/{b.seg(cursor.run_id)}/stream" + ("" if cursor.live_frames else "?live=false")
        return self._c.http.stream("GET", url, headers=headers, timeout=timeout)

    def _lookup(self, cursor: b.Cursor, pace: b.Reconnect) -> Run | None:
        """The followed run (None: no run has its agent_id yet; the POST may still be on its way)."""
        try:
            return cast(Run, self._c.send(cursor.run_call(), timeout=pace.read_timeout()))
        except NotFound:
            if cursor.run_id:
                raise
            return None

    def _follow(self, cursor: b.Cursor, pace: b.Reconnect, first: _Opener | None) -> Iterator[Event]:
        while not cursor.finished:
            pace.check(cursor)  # FollowTimeout once the deadline has passed
            posting, first = first, None  # a POST is sent once: later attempts re-attach by GET
            before = cursor.last_seq
            try:
                yield from self._read(posting() if posting else self._get_opener(cursor, pace), cursor, pace)
                if cursor.finished or self._has_ended(cursor, pace):
                    return
            except _DROPPED as exc:
                if posting is not None and isinstance(exc, httpx.ConnectError):
                    raise ConnectionFailed(f"POST to {self._c.url} starting a run: {exc!r}") from exc
                time.sleep(b.drop_wait(pace, cursor, exc))  # backoff, bounded by reconnect_timeout and the deadline
                continue
            time.sleep(pace.after_clean_close(cursor.last_seq > before))  # closed without an end: not a busy loop

    def _has_ended(self, cursor: b.Cursor, pace: b.Reconnect) -> bool:
        """Whether the run of a stream that closed without a terminal event has ended (asked of the runtime)."""
        run = self._lookup(cursor, pace)
        cursor.finished = run is not None and str(run.get("state") or "") in TERMINAL_STATES
        return cursor.finished

    def _read(
        self, opener: AbstractContextManager[httpx.Response], cursor: b.Cursor, pace: b.Reconnect
    ) -> Iterator[Event]:
        with opener as resp:
            if resp.status_code >= 400:
                resp.read()
                if resp.status_code in b.RETRYABLE_STATUSES and cursor.opened > 0:
                    raise httpx.RemoteProtocolError(f"HTTP {resp.status_code} while reconnecting")
                raise error_from_response(resp)
            if cursor.opened:
                cursor.live.reconnected()  # the re-attached stream sends the call's live text again
            cursor.opened += 1
            for sse in EventSource(resp).iter_sse():
                pace.delivered()  # the stream is back: the next outage gets the full timeout
                event = event_from_sse(sse.event, sse.data, sse.id)
                if cursor.accept(event):
                    yield from cursor.live.feed(event)
                if cursor.finished:
                    return
                pace.check(cursor)


__all__ = ["ApiError", "Client"]
