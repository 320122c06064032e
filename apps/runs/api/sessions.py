"""Session routes (SPEC 2.3, 4.5): a session's transcript, continuing it, replaying
it into a new session. auth -> schema -> service -> schema; the rules are
apps.runs.sessions.services' and apps.runs.sessions.promotion'."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.runs.api import run_create_data, run_response
from apps.runs.models import Run
from apps.runs.response_schemas import SessionTranscriptOut
from apps.runs.schemas import RunCreatedOut
from apps.runs.sessions import services as session_services
from apps.runs.sessions.schemas import SessionMessageIn, SessionReplayIn, SessionReplayOut

router = Router(tags=["sessions"])


def _check_session(session_id: str) -> None:
    if not is_ident(session_id):
        raise Invalid("invalid session_id: must match [A-Za-z0-9_-]{1,128}", code="invalid_request")


@router.get(
    "/sessions/{session_id}/transcript",
    response=SessionTranscriptOut,
    exclude_unset=True,  # an event's `payload` is there only for user_input and system_prompt
    summary="A session's runs and their events, in order",
)
def sessions_transcript(request: HttpRequest, session_id: str) -> dict[str, Any]:
    _check_session(session_id)
    return session_services.session_transcript(principal=request_principal(request), session_id=session_id)


def _continue(principal: Principal, session_id: str, data: SessionMessageIn) -> Run:
    try:
        # The wire schema's agent is None (the session's own); the service sets it.
        create = dataclasses.replace(run_create_data(data), agent="")
        return session_services.session_continue(principal=principal, session_id=session_id, data=create)
    finally:
        connection.close()


@router.post(
    "/sessions/{session_id}/messages",
    response={202: RunCreatedOut},
    openapi_extra=openapi_body(SessionMessageIn),
    summary="Continue a session: a new run that replays its history (SSE; background:true returns 202 JSON)",
)
async def sessions_messages(request: HttpRequest, session_id: str) -> HttpResponseBase:
    _check_session(session_id)
    data = parse_body(request, SessionMessageIn, max_bytes=settings.LOOMCYCLE.max_request_bytes)
    principal: Principal = request_principal(request)
    return await run_response(principal, data, lambda: _continue(principal, session_id, data))


@router.post(
    "/sessions/{session_id}/replay",
    response=SessionReplayOut,
    openapi_extra=openapi_body(SessionReplayIn),
    summary="Copy a session's history into a new session, optionally for another agent",
)
def sessions_replay(request: HttpRequest, session_id: str) -> dict[str, Any]:
    _check_session(session_id)
    data = parse_body(request, SessionReplayIn, max_bytes=1024 * 1024, required=False)
    return session_services.session_replay(
        principal=request_principal(request), session_id=session_id, agent=data.agent
    )
