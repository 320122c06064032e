"""Session reads (SPEC 2.3, 4.5). A session is the set of top-level runs that
share a `session_id`; all of them belong to the tenant and user of the run
that made it (apps.runs.sessions.promotion checks every new one), so a session is found
only through its owner: another tenant's or user's session is NotFound, the
same answer as an unknown id (no existence leak)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from django.db.models import Subquery

from apps.core.errors import NotFound
from apps.runs.compacted import MARKER_ROLE, visible_rows
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.runs.statuses import SESSION_IDLE

Rows = list[tuple[str, list[dict[str, Any]]]]


@dataclass(frozen=True)
class SessionHead:
    """The session as the run that made it (turn 0) describes it."""

    id: str
    tenant_id: str
    user_id: str
    agent: str
    created_at: Any


def _top(session_id: str) -> Any:
    return Run.objects.filter(session_id=session_id, parent__isnull=True)


def session_head(*, tenant_id: str | None, session_id: str, owner: str | None = None) -> SessionHead:
    """The session of `tenant_id` (None: any, an admin's read) and, when given,
    of user `owner`; NotFound otherwise."""
    qs = _top(session_id)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if owner is not None:
        qs = qs.filter(user_id=owner)
    first = qs.order_by("session_turn", "created_at", "id").first()
    if first is None:
        raise NotFound(f"unknown session {session_id}", code="session_not_found")
    return SessionHead(first.session_id, first.tenant_id, first.user_id, first.agent_name, first.created_at)


def session_history(*, tenant_id: str, session_id: str, before_turn: int | None = None) -> Rows:
    """The transcript rows a continuation replays: the session's top-level runs
    before `before_turn` (all when None), in turn order, less those a `rollback`
    dropped; each run's rows in their order. A run that did not replay the session
    (its first turn, or one appended with `session_id`) contributes its compacted
    form (apps.runs.compacted.visible_rows): its markers were made against its own
    rows only, so left raw, the latest one would cut the earlier turns out of the
    whole history. A replaying run's markers were made against the prefix before it,
    so its rows stay raw."""
    qs = TranscriptEntry.objects.filter(
        run__session_id=session_id,
        run__tenant_id=tenant_id,
        run__parent__isnull=True,
        run__session_rolled_back=False,
    )
    if before_turn is not None:
        qs = qs.filter(run__session_turn__lt=before_turn)
    rows = qs.order_by("run__session_turn", "run_id", "idx").values_list(
        "run_id", "run__replays_session", "role", "content"
    )
    out: Rows = []
    for (_, replays), group in groupby(rows, key=lambda r: (r[0], r[1])):
        own: Rows = [(str(role), list(content)) for _, _, role, content in group]
        out.extend(own if replays else visible_rows(own))
    return out


def session_compacted(*, tenant_id: str, session_id: str) -> bool:
    """Whether a run of the history a replay copies (top-level, not rolled back) was
    compacted: its marker is copied as it is (a replaying run) or applied (the others'
    compacted form, session_history)."""
    return bool(
        TranscriptEntry.objects.filter(
            run__session_id=session_id,
            run__tenant_id=tenant_id,
            run__parent__isnull=True,
            run__session_rolled_back=False,
            role=MARKER_ROLE,
        ).exists()
    )


def session_transcript_runs(*, head: SessionHead) -> list[Run]:
    return list(_top(head.id).filter(tenant_id=head.tenant_id).order_by("session_turn", "id"))


def session_events(*, run_ids: list[str]) -> list[RunEvent]:
    """The events of these runs, each run's in seq order, the runs in the order given."""
    order = {run_id: n for n, run_id in enumerate(run_ids)}
    events = list(RunEvent.objects.filter(run_id__in=run_ids))
    events.sort(key=lambda e: (order[e.run_id], e.seq))
    return events


def session_has_later_turn(*, tenant_id: str, session_id: str, turn: int) -> bool:
    """Whether the session has a top-level run after `turn` (a retry may re-open only
    the latest turn: under store.session_lock, no later one appears meanwhile)."""
    return bool(_top(session_id).filter(tenant_id=tenant_id, session_turn__gt=turn).exists())


def session_waiting_of(*, run_id: str) -> str | None:
    """The session of top-level run `run_id` when a run waits behind it there, else None."""
    session = Run.objects.filter(id=run_id, parent__isnull=True).values("session_id")[:1]
    waiting = Run.objects.filter(session_id=Subquery(session), parent__isnull=True, status=RunStatus.WAITING_SESSION)
    return waiting.values_list("session_id", flat=True).first()


def sessions_stalled(*, limit: int = 200) -> list[str]:
    """Sessions with an enqueued run and no run in flight (a promotion lost with its process)."""
    live = Run.objects.filter(parent__isnull=True).exclude(status__in=SESSION_IDLE)
    waiting = Run.objects.filter(parent__isnull=True, status=RunStatus.WAITING_SESSION)
    stalled = waiting.exclude(session_id__in=live.values("session_id"))
    return list(stalled.values_list("session_id", flat=True).distinct()[:limit])
