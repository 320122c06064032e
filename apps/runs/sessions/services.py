"""Session verbs of the API (SPEC 2.3, 4.5): continue a session, replay it into a
new one, read its transcript. Invariants:
- a session is reached only through its owner: the caller's tenant, and a user
  the caller may act as; anything else is 404 `session_not_found`, as for an
  unknown id;
- continuing is `run_create` with the session's agent and user, replaying the
  stored history (apps.runs.sessions.promotion), under the same one-in-flight rule and
  `multitask_strategy` as `session_id` on POST /v1/runs;
- a replay writes one new run, terminal from the start (`completed`,
  stop_reason `session_replay`), whose transcript is the source session's
  replayed history: the new session's first turn. Nothing of the source changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction

from apps.core.errors import Conflict, Invalid, NotFound
from apps.core.identity import acting_user_id
from apps.core.timefmt import ts
from apps.core.types import Principal
from apps.runs import create, store
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.runs.sessions import replay
from apps.runs.sessions.selectors import (
    SessionHead,
    session_compacted,
    session_events,
    session_head,
    session_transcript_runs,
)


def _owned(principal: Principal, session_id: str) -> SessionHead:
    """The session, if the caller may write to it: its tenant, and its user the one
    the caller acts as (an isolated member acts only as itself)."""
    head = session_head(tenant_id=principal.tenant_id, session_id=session_id)
    if acting_user_id(principal, head.user_id) != head.user_id:
        raise NotFound(f"unknown session {session_id}", code="session_not_found")
    return head


def session_continue(*, principal: Principal, session_id: str, data: create.RunCreate) -> Run:
    """A new run in the session, with the session's agent and user, whose model sees
    the session's stored history first (POST /v1/sessions/{id}/messages)."""
    head = _owned(principal, session_id)
    joined = dataclasses.replace(
        data, agent=head.agent, user_id=head.user_id, session_id=session_id, replay_session=True
    )
    return create.run_create(principal=principal, data=joined)


def session_replay(*, principal: Principal, session_id: str, agent: str | None) -> dict[str, Any]:
    """Copy the session's history into a new session, for `agent` (the session's when
    None): 400 `empty_source` when it has none, 409 `agent_gone` when the agent does not
    resolve."""
    head = _owned(principal, session_id)
    rows = replay.replayed_history(tenant_id=head.tenant_id, session_id=session_id, turn=None)
    if not rows:
        raise Invalid(f"session {session_id} has no history to replay", code="empty_source")
    marker = Segment(text=f"[replay of session {session_id}: {len(rows)} messages]")
    data = create.RunCreate(agent=agent or head.agent, segments=[marker], user_id=head.user_id)
    try:
        resolved = create.run_resolve(tenant_id=principal.tenant_id, data=data)
    except Invalid as exc:
        if exc.code != "unknown_agent":
            raise
        raise Conflict(f"agent {data.agent!r} is gone: {exc.message}", code="agent_gone") from exc
    with transaction.atomic():
        seed = create.run_insert(
            tenant_id=principal.tenant_id, data=data, resolved=resolved, status=RunStatus.COMPLETED, transcript=rows
        )
        store.seed_finish(run_id=seed.id)
    compacted = session_compacted(tenant_id=head.tenant_id, session_id=session_id)
    return {
        "new_session_id": seed.session_id,
        "seed_run_id": seed.id,
        "events_copied": len(rows),
        "compacted": compacted,
    }


def session_transcript(*, principal: Principal, session_id: str) -> dict[str, Any]:
    """GET /v1/sessions/{id}/transcript: the session, its runs in turn order, and
    their events (each run's in seq order)."""
    head = session_head(tenant_id=principal.read_tenant, owner=principal.read_user, session_id=session_id)
    runs = session_transcript_runs(head=head)
    events = session_events(run_ids=[r.id for r in runs])
    return {
        "session": {
            "id": head.id,
            "tenant_id": head.tenant_id,
            "agent": head.agent,
            "user_id": head.user_id,
            "created_at": ts(head.created_at),
        },
        "runs": [_run_out(r) for r in runs],
        "events": [_event_out(e) for e in events],
    }


def _run_out(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "agent_id": run.agent_id,
        "agent": run.agent_name,
        "turn": run.session_turn,
        "state": run.status,
        "replays_session": run.replays_session,
        "rolled_back": run.session_rolled_back,
    }


_RAW_PAYLOAD = frozenset({"user_input", "system_prompt"})


def _event_out(event: RunEvent) -> dict[str, Any]:
    out = {
        "seq": event.seq,
        "run_id": event.run_id,
        "ts_ns": int(event.created_at.timestamp() * 1_000_000) * 1000,
        "type": event.type,
        "event": event.payload,
    }
    if event.type in _RAW_PAYLOAD:
        out["payload"] = event.payload
    return out
