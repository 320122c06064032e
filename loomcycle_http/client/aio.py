"""The asynchronous client: `AsyncClient(url, token)`, the sync client's twin (the same resources
and operations, awaited; streams and lists are async iterators). Every refusal raises a typed
`ApiError`; run streams reconnect from the last seq they saw (see `Runs.stream`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import httpx
from httpx_sse import EventSource

from loomcycle_http.client import _base as b
from loomcycle_http.client.agents import AsyncAgents
from loomcycle_http.client.budgets import AsyncBudgets
from loomcycle_http.client.channels import AsyncChannels
from loomcycle_http.client.config import AsyncConfig
from loomcycle_http.client.defs import AsyncDefs
from loomcycle_http.client.errors import ApiError, ConnectionFailed, NotFound, error_from_response
from loomcycle_http.client.events import TERMINAL_STATES, Event, RunRef, event_from_sse
from loomcycle_http.client.gateway import AsyncGateway
from loomcycle_http.client.lifecycle import AsyncErasure, AsyncRetention
from loomcycle_http.client.memory import AsyncMemory
from loomcycle_http.client.pages import RUNS_PAGE, apaged, children_query, runs_query
from loomcycle_http.client.runtime import AsyncRuntime
from loomcycle_http.client.sessions import AsyncInterrupts, AsyncSessions
from loomcycle_http.client.snapshots import AsyncSnapshots
from loomcycle_http.client.tokens import AsyncTokens, AsyncVolumes
from loomcycle_http.client.triggers import AsyncHooks, AsyncSchedules, AsyncWebhooks
from loomcycle_http.client.types import Run

JsonList = list[Any]  # (an alias: `list` is also a method name in the classes below)
_DROPPED = (httpx.TransportError, ConnectionFailed)
_Opener = Callable[[], AbstractAsyncContextManager[httpx.Response]]


class AsyncClient:
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
        self.http = httpx.AsyncClient(base_url=self.url, headers=b.auth_headers(token), timeout=timeout, **httpx_kwargs)
        self.runs = Runs(self)
        self.agents = AsyncAgents(self)
        self.skills, self.mcp_servers = AsyncDefs(self, "skill"), AsyncDefs(self, "mcpserver")
        self.schedule_defs, self.webhook_defs = AsyncDefs(self, "schedule"), AsyncDefs(self, "webhook")
        self.a2a_server_cards, self.a2a_agents = AsyncDefs(self, "a2aservercard"), AsyncDefs(self, "a2aagent")
        self.volumes, self.tokens = AsyncVolumes(self), AsyncTokens(self)
        self.memory = AsyncMemory(self)
        self.channels = AsyncChannels(self)
        self.runtime = AsyncRuntime(self)
        self.budgets = AsyncBudgets(self)
        self.sessions = AsyncSessions(self)
        self.interrupts = AsyncInterrupts(self)
        self.snapshots = AsyncSnapshots(self)
        self.hooks, self.schedules, self.webhooks = AsyncHooks(self), AsyncSchedules(self), AsyncWebhooks(self)
        self.retention, self.erasure = AsyncRetention(self), AsyncErasure(self)
        self.gateway = AsyncGateway(self)
        self.config = AsyncConfig(self)  # presets and the env template (admin)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def send(self, call: b.Call, *, timeout: float | None = None) -> Any:
        """Send `call`; its JSON answer (None for 204), or the typed error (429/503 after `retries`)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        attempt = 0
        while True:
            try:
                resp = await self.http.request(call.method, call.path, json=call.json, params=call.params, **extra)
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"{call.method} {self.url}{call.path}: {exc!r}") from exc
            if resp.status_code < 400:
                return None if resp.status_code == 204 or not resp.content else resp.json()
            error = error_from_response(resp)
            wait = self.retries.wait(attempt, error.retry_after) if resp.status_code in self.retries.statuses else None
            if wait is None:
                raise error
            attempt += 1
            await asyncio.sleep(wait)


class Runs:
    """Runs: start, follow, read, steer and cancel them."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("runs_create")
    async def create(self, agent: str, prompt: str | None = None, **fields: Any) -> RunRef:
        """Start a run in the background (POST /v1/runs, `background: true`); its handles."""
        body = b.run_body(agent, prompt, {**fields, "background": True})
        return b.run_ref(await self._c.send(b.Call("POST", "/v1/runs", json=body)))

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
    ) -> AsyncIterator[Event]:
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
    ) -> AsyncIterator[Event]:
        """POST `body` (naming its run by `agent_id`) to a route answering a run's stream; follow the run."""
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
    ) -> AsyncIterator[Event]:
        """Follow a run (GET /v1/runs/{id}/stream) from after `from_seq` to its end.
        A dropped or silent connection is re-opened with `Last-Event-ID` (the last seq
        seen), so no event is lost or repeated; after `reconnect_timeout` seconds without
        getting a connection back, ConnectionFailed. `live=False`: committed events only, each
        whole (no live text and thinking frames). `timeout`: seconds the whole follow may take,
        then FollowTimeout (the run goes on). `until_input`: end after an `awaiting_input` event too."""
        cursor = b.Cursor(run_id=run_id, last_seq=from_seq, live_frames=live, until_input=until_input)
        return self._follow(cursor, b.Reconnect.of(reconnect_timeout, timeout), first=None)

    @b.op("runs_get")
    async def get(self, run_id: str) -> Run:
        return cast(Run, await self._c.send(b.Call("GET", f"/v1/runs/{b.seg(run_id)}")))

    @b.op("agents_get")
    async def get_by_agent_id(self, agent_id: str) -> Run:
        return cast(Run, await self._c.send(b.Call("GET", f"/v1/agents/{b.seg(agent_id)}")))

    async def resolve(self, ref: str) -> Run:
        """A run by its run_id, else by its agent_id."""
        try:
            return await self.get(ref)
        except NotFound:  # not a run_id: try it as an agent_id
            return await self._by_agent_id_or_404(ref)

    async def _by_agent_id_or_404(self, ref: str) -> Run:
        try:
            return await self.get_by_agent_id(ref)
        except NotFound as exc:
            raise NotFound(404, "not_found", f"no run with run_id or agent_id {ref!r}", {}, None) from exc

    @b.op("runs_list")
    async def list(self, *, status: str = "running", agent: str | None = None, tenant: str | None = None) -> JsonList:
        """Runs of the caller's tenant (GET /v1/runs), newest first."""
        return list((await self._c.send(b.runs_list_call(status, agent, tenant)))["runs"])

    @b.op("runs_list")
    def iter(self, *, status: str = "all", page_size: int = RUNS_PAGE, **filters: str | None) -> AsyncIterator[Run]:
        """Every run matching the filters, newest first, following `next_cursor` (GET /v1/runs)."""
        path, key, params = runs_query(page_size, status=status, **filters)
        return cast(AsyncIterator[Run], apaged(self._c.send, path, key, params))

    @b.op("runs_children")
    def children(self, run_id: str, *, status: str = "all", page_size: int = RUNS_PAGE) -> AsyncIterator[Run]:
        """The run's direct sub-agent runs, newest first, page after page (GET /v1/runs/{id}/children)."""
        return cast(AsyncIterator[Run], apaged(self._c.send, *children_query(run_id, status, page_size)))

    @b.op("runs_events")
    async def events(self, run_id: str, *, from_seq: int = 0) -> AsyncIterator[Event]:
        """Every persisted event after `from_seq`, as stored (GET /v1/runs/{id}/events, paged)."""
        while True:
            page = await self._c.send(b.events_call(run_id, from_seq, 500))
            for row in page["events"]:
                from_seq = int(row["seq"])
                yield Event(type=str(row["type"]), data=dict(row["payload"]), seq=from_seq)
            if not page["events"] or from_seq >= int(page["last_seq"]):
                return

    @b.op("runs_events")
    async def event_rows(self, run_id: str, *, from_seq: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Every persisted event after `from_seq` as the API returns it (`seq`, `type`,
        `payload`, `created_at`), paged; `events` is the same as `Event`s."""
        while True:
            page = await self._c.send(b.events_call(run_id, from_seq, 500))
            for row in page["events"]:
                from_seq = int(row["seq"])
                yield dict(row)
            if not page["events"] or from_seq >= int(page["last_seq"]):
                return

    @b.op("agents_cancel")
    async def cancel(self, agent_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a run by its agent_id (and its live sub-runs); idempotent."""
        body = {"reason": reason} if reason else {}
        return dict(await self._c.send(b.Call("POST", f"/v1/agents/{b.seg(agent_id)}/cancel", json=body)))

    @b.op("runs_turn_cancel")
    async def cancel_turn(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        """Turn-cancel an interactive run: stop its current model turn or tool batch and re-park it
        at `awaiting_input` (`{run_id, stopped, parked}`); 409 `not_interactive` / `not_mid_turn`."""
        body = {"reason": reason} if reason else {}
        return dict(await self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/cancel", json=body)))

    @b.op("runs_input")
    async def input(self, run_id: str, text: str) -> dict[str, Any]:
        """Steer a live run, or answer one parked at `awaiting_input`."""
        return dict(await self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/input", json={"text": text})))

    @b.op("runs_fork")
    async def fork(self, run_id: str, from_step: int, **fields: Any) -> dict[str, Any]:
        """A new run in a new session from this run's transcript through `from_step`."""
        body = {"from_step": from_step, **fields}
        return dict(await self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/fork", json=body)))

    @b.op("runs_compact")
    async def compact(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """Queue a compaction of the run's context for its next iteration (`keep_last_n`, `keep_first`)."""
        return dict(await self._c.send(b.Call("POST", f"/v1/runs/{b.seg(run_id)}/compact", json=fields)))

    @b.op("runs_delete")
    async def delete(self, run_id: str, *, cancel: bool = False) -> dict[str, Any]:
        """Delete an ended run and its tree (`cancel=True`: cancel a live tree and delete it when it ends)."""
        return dict(await self._c.send(b.delete_run_call(run_id, cancel)))

    @b.op("runs_batch")
    async def batch(
        self, spawns: Sequence[dict[str, Any]], *, mode: str = "join", timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """Start up to 32 runs and wait for all (`join`), or have their handles at once (`detach`)."""
        call, wait = b.batch_call(spawns, mode, timeout_ms)
        return dict(await self._c.send(call, timeout=wait))

    @b.op("runs_webhooks")
    async def webhooks(self, run_id: str) -> JsonList:
        return list((await self._c.send(b.Call("GET", f"/v1/runs/{b.seg(run_id)}/webhooks")))["deliveries"])

    @b.op("users_agents")
    async def of_user(self, user_id: str, *, status: str = "running") -> JsonList:
        return list((await self._c.send(b.user_runs_call(user_id, status)))["agents"])

    @b.op("users_agents_stream")
    async def watch_user(
        self, user_id: str, *, status: str | None = None, agent: str | None = None
    ) -> AsyncIterator[Event]:
        """`stream_open`, then one `run_state` event per change of the user's runs, until the server ends it."""
        path, params = b.user_states_path(user_id, status, agent)
        timeout = httpx.Timeout(30.0, read=b.STREAM_READ_TIMEOUT_S)
        async with self._c.http.stream("GET", path, params=params, timeout=timeout) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise error_from_response(resp)
            async for sse in EventSource(resp).aiter_sse():
                if not b.is_keepalive(sse.event, sse.data):
                    yield event_from_sse(sse.event, sse.data, "")

    def _post_opener(
        self, path: str, body: dict[str, Any], pace: b.Reconnect
    ) -> AbstractAsyncContextManager[httpx.Response]:
        timeout = httpx.Timeout(30.0, read=pace.read_timeout())
        return self._c.http.stream("POST", path, json=body, timeout=timeout)

    async def _get_opener(self, cursor: b.Cursor, pace: b.Reconnect) -> AbstractAsyncContextManager[httpx.Response]:
        if not cursor.run_id:  # the POST's answer never named the run: find it by its handle
            cursor.run_id = b.found_run_id(cursor, await self._lookup(cursor, pace))
        headers = {"Last-Event-ID": str(cursor.last_seq)}
        timeout = httpx.Timeout(30.0, read=pace.read_timeout())
        url = f"/v1/runs/{b.seg(cursor.run_id)}/stream" + ("" if cursor.live_frames else "?live=false")
        return self._c.http.stream("GET", url, headers=headers, timeout=timeout)

    async def _lookup(self, cursor: b.Cursor, pace: b.Reconnect) -> Run | None:
        """The followed run (None: no run has its agent_id yet; the POST may still be on its way)."""
        try:
            return cast(Run, await self._c.send(cursor.run_call(), timeout=pace.read_timeout()))
        except NotFound:
            if cursor.run_id:
                raise
            return None

    async def _follow(self, cursor: b.Cursor, pace: b.Reconnect, first: _Opener | None) -> AsyncIterator[Event]:
        while not cursor.finished:
            pace.check(cursor)  # FollowTimeout once the deadline has passed
            posting, first = first, None  # a POST is sent once: later attempts re-attach by GET
            before = cursor.last_seq
            try:
                opener = posting() if posting else await self._get_opener(cursor, pace)
                async for event in self._read(opener, cursor, pace):
                    yield event
                if cursor.finished or await self._has_ended(cursor, pace):
                    return
            except _DROPPED as exc:
                if posting is not None and isinstance(exc, httpx.ConnectError):
                    raise ConnectionFailed(f"POST to {self._c.url} starting a run: {exc!r}") from exc
                await asyncio.sleep(b.drop_wait(pace, cursor, exc))  # backoff, bounded by reconnect_timeout
                continue
            await asyncio.sleep(pace.after_clean_close(cursor.last_seq > before))  # closed without an end

    async def _has_ended(self, cursor: b.Cursor, pace: b.Reconnect) -> bool:
        """Whether the run of a stream that closed without a terminal event has ended (asked of the runtime)."""
        run = await self._lookup(cursor, pace)
        cursor.finished = run is not None and str(run.get("state") or "") in TERMINAL_STATES
        return cursor.finished

    async def _read(
        self, opener: AbstractAsyncContextManager[httpx.Response], cursor: b.Cursor, pace: b.Reconnect
    ) -> AsyncIterator[Event]:
        async with opener as resp:
            if resp.status_code >= 400:
                await resp.aread()
                if resp.status_code in b.RETRYABLE_STATUSES and cursor.opened > 0:
                    raise httpx.RemoteProtocolError(f"HTTP {resp.status_code} while reconnecting")
                raise error_from_response(resp)
            if cursor.opened:
                cursor.live.reconnected()  # the re-attached stream sends the call's live text again
            cursor.opened += 1
            async for sse in EventSource(resp).aiter_sse():
                pace.delivered()  # the stream is back: the next outage gets the full timeout
                event = event_from_sse(sse.event, sse.data, sse.id)
                if cursor.accept(event):
                    for shown in cursor.live.feed(event):
                        yield shown
                if cursor.finished:
                    return
                pace.check(cursor)


__all__ = ["ApiError", "AsyncClient"]
