"""`client.sessions` and `client.interrupts`: conversations (GET /v1/sessions, transcript, a new
message, replay) and the Interruption.ask inbox (a run's interrupts, a user's, answering one)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

from loomcycle_http.client import _base as b
from loomcycle_http.client.events import Event, RunRef
from loomcycle_http.client.pages import SESSIONS_PAGE, apaged, paged, sessions_query
from loomcycle_http.client.types import Session

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Rows = list[Row]


def messages_path(session_id: str) -> str:
    return f"/v1/sessions/{b.seg(session_id)}/messages"


def transcript_call(session_id: str) -> b.Call:
    return b.Call("GET", f"/v1/sessions/{b.seg(session_id)}/transcript")


def replay_call(session_id: str, agent: str | None) -> b.Call:
    return b.Call("POST", f"/v1/sessions/{b.seg(session_id)}/replay", json={"agent": agent} if agent else {})


def query(page_size: int, filters: dict[str, str | None]) -> tuple[str, str, dict[str, Any]]:
    """GET /v1/sessions with `user_id`, `agent`, `metadata` (JSON text), `active_after`, `active_before`."""
    return sessions_query(page_size, **filters)


def of_run_call(run_id: str, status: str) -> b.Call:
    return b.Call("GET", f"/v1/runs/{b.seg(run_id)}/interrupts", params={"status": status} if status else None)


def inbox_call(user_id: str, status: str) -> b.Call:
    return b.Call("GET", f"/v1/users/{b.seg(user_id)}/interrupts", params={"status": status})


def resolve_call(run_id: str, interrupt_id: str, reply: dict[str, Any]) -> b.Call:
    return b.Call("POST", f"/v1/runs/{b.seg(run_id)}/interrupts/{b.seg(interrupt_id)}/resolve", json=reply)


class Sessions:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("sessions_list")
    def iter(self, *, page_size: int = SESSIONS_PAGE, **filters: str | None) -> Iterator[Session]:
        """Every session the caller sees, latest activity first, page after page (GET /v1/sessions);
        filters `user_id`, `agent`, `metadata` (JSON text), `active_after`, `active_before`."""
        return cast(Iterator[Session], paged(self._c.send, *query(page_size, filters)))

    @b.op("sessions_transcript")
    def transcript(self, session_id: str) -> Row:
        """The session, its runs in turn order and their events (GET /v1/sessions/{id}/transcript)."""
        return dict(self._c.send(transcript_call(session_id)))

    @b.op("sessions_messages")
    def message(
        self,
        session_id: str,
        prompt: str | None = None,
        *,
        reconnect_timeout: float = b.RECONNECT_TIMEOUT_S,
        **fields: Any,
    ) -> Iterator[Event]:
        """Continue the session with a new run that sees its history (POST .../messages), streamed to its
        end as `runs.start` streams (the same reconnects); `fields` are POST /v1/runs's but `agent`,
        `session_id`, `user_id` (the session's)."""
        return self._c.runs.follow_post(messages_path(session_id), b.message_body(prompt, fields), reconnect_timeout)

    @b.op("sessions_messages")
    def create_message(self, session_id: str, prompt: str | None = None, **fields: Any) -> RunRef:
        """`message` in the background: the new run's handles."""
        body = b.message_body(prompt, {**fields, "background": True})
        return b.run_ref(self._c.send(b.Call("POST", messages_path(session_id), json=body)))

    @b.op("sessions_replay")
    def replay(self, session_id: str, *, agent: str | None = None) -> Row:
        """Copy the session's history into a new session, for `agent` if given (POST .../replay)."""
        return dict(self._c.send(replay_call(session_id, agent)))


class AsyncSessions:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("sessions_list")
    def iter(self, *, page_size: int = SESSIONS_PAGE, **filters: str | None) -> AsyncIterator[Session]:
        return cast(AsyncIterator[Session], apaged(self._c.send, *query(page_size, filters)))

    @b.op("sessions_transcript")
    async def transcript(self, session_id: str) -> Row:
        return dict(await self._c.send(transcript_call(session_id)))

    @b.op("sessions_messages")
    def message(
        self,
        session_id: str,
        prompt: str | None = None,
        *,
        reconnect_timeout: float = b.RECONNECT_TIMEOUT_S,
        **fields: Any,
    ) -> AsyncIterator[Event]:
        return self._c.runs.follow_post(messages_path(session_id), b.message_body(prompt, fields), reconnect_timeout)

    @b.op("sessions_messages")
    async def create_message(self, session_id: str, prompt: str | None = None, **fields: Any) -> RunRef:
        body = b.message_body(prompt, {**fields, "background": True})
        return b.run_ref(await self._c.send(b.Call("POST", messages_path(session_id), json=body)))

    @b.op("sessions_replay")
    async def replay(self, session_id: str, *, agent: str | None = None) -> Row:
        return dict(await self._c.send(replay_call(session_id, agent)))


class Interrupts:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("interrupts_of_run")
    def of_run(self, run_id: str, *, status: str = "") -> Rows:
        """A run's interrupts, oldest first (`status`: pending, answered, ..., all; "" the server's default)."""
        return list(self._c.send(of_run_call(run_id, status))["interrupts"])

    @b.op("interrupts_of_user")
    def inbox(self, user_id: str, *, status: str = "pending") -> Rows:
        """A user's interrupts, newest first (GET /v1/users/{id}/interrupts)."""
        return list(self._c.send(inbox_call(user_id, status))["interrupts"])

    @b.op("interrupts_resolve")
    def resolve(self, run_id: str, interrupt_id: str, **reply: Any) -> Row:
        """Answer (`answer=`) or decline (`disposition="declined"`, `note=`) an ask: `{interrupt_id, status,
        resolved_at}`; 409 when it is not pending, 410 `interrupt_expired`."""
        return dict(self._c.send(resolve_call(run_id, interrupt_id, reply)))


class AsyncInterrupts:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("interrupts_of_run")
    async def of_run(self, run_id: str, *, status: str = "") -> Rows:
        return list((await self._c.send(of_run_call(run_id, status)))["interrupts"])

    @b.op("interrupts_of_user")
    async def inbox(self, user_id: str, *, status: str = "pending") -> Rows:
        return list((await self._c.send(inbox_call(user_id, status)))["interrupts"])

    @b.op("interrupts_resolve")
    async def resolve(self, run_id: str, interrupt_id: str, **reply: Any) -> Row:
        return dict(await self._c.send(resolve_call(run_id, interrupt_id, reply)))
