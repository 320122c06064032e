"""A user's conversations (GET /v1/sessions, the History tool's list): sessions, newest activity
first, cursor-paginated.

A session is its top-level runs (apps.runs.sessions.selectors); its row here is their aggregate:
created_at (the first run's), last_activity_at (the latest of any run's creation, last update or
end), run_count, the latest run's id and status, the first run's agent and metadata, and a title
(the first run's `metadata.title` when it is a string, else the start of its first user turn).
The cursor carries the last row's (last_activity_at, session_id), so a page is a keyset range and
a conversation that gets a new turn while a client pages moves to the front instead of repeating.
Filters: the owner (always, for an isolated member), the agent (sessions with a run of it), the
metadata (sessions with a run whose metadata holds every given key/value), last activity bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Coalesce, Greatest

from apps.core.timefmt import iso_z
from apps.runs.models import PARKED, RUNNABLE, Run, TranscriptEntry
from apps.runs.pages import check_limit, cursor_decode, cursor_encode

TITLE_CHARS = 80


@dataclass(frozen=True)
class SessionFilter:
    user_id: str = ""
    agent: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    active_after: datetime | None = None
    active_before: datetime | None = None


@dataclass(frozen=True)
class SessionsPage:
    sessions: list[dict[str, Any]]
    next_cursor: str


def _grouped(tenant_id: str | None, f: SessionFilter) -> Any:
    qs = Run.objects.filter(parent__isnull=True)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if f.user_id:
        qs = qs.filter(user_id=f.user_id)
    if f.agent:
        qs = qs.filter(agent_name=f.agent)
    if f.metadata:
        qs = qs.filter(metadata__contains=f.metadata)
    activity = Greatest("created_at", "updated_at", Coalesce("completed_at", "created_at"))
    grouped = qs.values("session_id").annotate(created=Min("created_at"), last=Max(activity), runs=Count("id"))
    if f.active_after is not None:
        grouped = grouped.filter(last__gt=f.active_after)
    if f.active_before is not None:
        grouped = grouped.filter(last__lt=f.active_before)
    return grouped


def sessions_page(*, tenant_id: str | None, f: SessionFilter, limit: int, cursor: str = "") -> SessionsPage:
    """One page of the sessions of `tenant_id` (None: every tenant, an admin's read) that `f` keeps."""
    grouped = _grouped(tenant_id, f)
    if cursor:
        at, session_id = cursor_decode(cursor)
        grouped = grouped.filter(Q(last__lt=at) | Q(last=at, session_id__lt=session_id))
    rows = list(grouped.order_by("-last", "-session_id")[: check_limit(limit) + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    out = _described([r["session_id"] for r in rows], tenant_id)
    sessions = [_row(r, *out[r["session_id"]]) for r in rows]
    next_cursor = cursor_encode(rows[-1]["last"], rows[-1]["session_id"]) if more else ""
    return SessionsPage(sessions, next_cursor)


def _described(session_ids: list[str], tenant_id: str | None) -> dict[str, tuple[Run, Run, str]]:
    """Per session: its first run, its latest run, its title (two queries for the whole page)."""
    qs = Run.objects.filter(session_id__in=session_ids, parent__isnull=True)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    firsts = {r.session_id: r for r in qs.order_by("session_id", "session_turn", "created_at").distinct("session_id")}
    latest = {r.session_id: r for r in qs.order_by("session_id", "-created_at", "-id").distinct("session_id")}
    first_turns = TranscriptEntry.objects.filter(run_id__in=[r.id for r in firsts.values()], idx=0, role="user")
    texts = {row.run_id: _text(row.content) for row in first_turns}
    return {sid: (first, latest[sid], _title(first, texts.get(first.id, ""))) for sid, first in firsts.items()}


def _text(content: Any) -> str:
    blocks = content if isinstance(content, list) else []
    return " ".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _title(first: Run, text: str) -> str:
    given = (first.metadata or {}).get("title")
    if isinstance(given, str) and given.strip():
        return given.strip()[:TITLE_CHARS]
    flat = " ".join(text.split())
    return flat if len(flat) <= TITLE_CHARS else flat[: TITLE_CHARS - 1] + "…"


def _row(agg: dict[str, Any], first: Run, latest: Run, title: str) -> dict[str, Any]:
    live = latest.status in RUNNABLE or latest.status in PARKED
    return {
        "session_id": agg["session_id"],
        "agent": first.agent_name,
        "user_id": first.user_id,
        "title": title,
        "created_at": iso_z(agg["created"]),
        "last_activity_at": iso_z(agg["last"]),
        "run_count": agg["runs"],
        "last_run_id": latest.id,
        "status": "running" if live else latest.status,
        "metadata": first.metadata or {},
    }


def session_has_agent(*, tenant_id: str, session_id: str, agent: str) -> bool:
    """Whether a top-level run of `agent` is in the session (the History tool's `self` scope)."""
    runs = Run.objects.filter(session_id=session_id, tenant_id=tenant_id, parent__isnull=True, agent_name=agent)
    return runs.exists()
