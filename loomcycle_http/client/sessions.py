"""`client.sessions` and `client.interrupts`: conversations (GET /v1/sessions, transcript, replay)
and the Interruption.ask inbox (a run's interrupts, a user's, answering one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from loomcycle_http.client import _base as b
from loomcycle_http.client.pages import SESSIONS_PAGE, paged, sessions_query
from loomcycle_http.client.types import Session

if TYPE_CHECKING:
    from loomcycle_http.client.sync import Client


class Sessions:
    def __init__(self, client: Client) -> None:
        self._c = client

    def iter(
        self,
        *,
        user_id: str | None = None,
        agent: str | None = None,
        metadata: str | None = None,
        active_after: str | None = None,
        active_before: str | None = None,
        page_size: int = SESSIONS_PAGE,
    ) -> Iterator[Session]:
        """Every session the caller sees, latest activity first, page after page (GET /v1/sessions)."""
        filters = {"user_id": user_id, "agent": agent, "metadata": metadata}
        path, key, params = sessions_query(page_size, active_after=active_after, active_before=active_before, **filters)
        return cast(Iterator[Session], paged(self._c.send, path, key, params))

    def transcript(self, session_id: str) -> dict[str, Any]:
        """The session, its runs in turn order and their events (GET /v1/sessions/{id}/transcript)."""
        return dict(self._c.send(b.Call("GET", f"/v1/sessions/{b.seg(session_id)}/transcript")))

    def replay(self, session_id: str, *, agent: str | None = None) -> dict[str, Any]:
        """Copy the session's history into a new session, for `agent` if given (POST .../replay)."""
        body = {"agent": agent} if agent else {}
        return dict(self._c.send(b.Call("POST", f"/v1/sessions/{b.seg(session_id)}/replay", json=body)))


class Interrupts:
    def __init__(self, client: Client) -> None:
        self._c = client

    def of_run(self, run_id: str, *, status: str = "") -> list[dict[str, Any]]:
        """A run's interrupts, oldest first (`status`: pending, answered, ..., all; "" the server's default)."""
        params = {"status": status} if status else None
        call = b.Call("GET", f"/v1/runs/{b.seg(run_id)}/interrupts", params=params)
        return list(self._c.send(call)["interrupts"])

    def inbox(self, user_id: str, *, status: str = "pending") -> list[dict[str, Any]]:
        """A user's interrupts, newest first (GET /v1/users/{id}/interrupts)."""
        call = b.Call("GET", f"/v1/users/{b.seg(user_id)}/interrupts", params={"status": status})
        return list(self._c.send(call)["interrupts"])

    def resolve(self, run_id: str, interrupt_id: str, **reply: Any) -> dict[str, Any]:
        """Answer (`answer=`) or decline (`disposition="declined"`, `note=`) an ask: `{interrupt_id, status,
        resolved_at}`; 409 when it is not pending, 410 `interrupt_expired`."""
        path = f"/v1/runs/{b.seg(run_id)}/interrupts/{b.seg(interrupt_id)}/resolve"
        return dict(self._c.send(b.Call("POST", path, json=reply)))
