"""List routes of the integration surface (issue 38): a run's children and a user's sessions,
cursor-paginated. auth -> query -> selector -> schema; the rules are apps.runs.pages' and
apps.runs.sessions.listing's."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import request_principal
from apps.core.ids import is_ident
from apps.runs import pages, selectors
from apps.runs.completion.selectors import deliveries_of
from apps.runs.pages_schemas import ChildrenPageOut, ErrorOut, SessionsPageOut, WebhookDeliveriesOut
from apps.runs.presenters import agent_out
from apps.runs.query import query_object, query_time
from apps.runs.sessions.listing import SessionFilter, sessions_page

router = Router(tags=["runs"])


def _ident(value: str, what: str) -> None:
    if value and not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")


@router.get(
    "/runs/{run_id}/children",
    response={200: ChildrenPageOut, 400: ErrorOut, 404: ErrorOut},
    summary="A run's direct sub-agent runs, newest first, cursor-paginated (ListChildRuns)",
)
def runs_children(
    request: HttpRequest, run_id: str, status: str = "all", limit: int = pages.DEFAULT_LIMIT, cursor: str = ""
) -> dict[str, Any]:
    _ident(run_id, "run_id")
    who = request_principal(request)
    parent = selectors.run_get(tenant_id=who.read_tenant, run_id=run_id, owner=who.read_user)
    page = pages.runs_page(
        tenant_id=parent.tenant_id,
        reader=who.read_user,
        f=pages.RunFilter(status=status, parent_id=parent.id),
        limit=limit,
        cursor=cursor,
    )
    return {"agents": [agent_out(r) for r in page.rows], "next_cursor": page.next_cursor}


@router.get(
    "/sessions",
    response={200: SessionsPageOut, 400: ErrorOut},
    summary="A user's conversations, latest activity first, cursor-paginated (filters: user_id, agent, "
    "metadata, active_after/before)",
)
def sessions_list(
    request: HttpRequest,
    user_id: str = "",
    agent: str = "",
    metadata: str = "",
    active_after: str = "",
    active_before: str = "",
    limit: int = 50,
    cursor: str = "",
) -> dict[str, Any]:
    _ident(user_id, "user_id")
    _ident(agent, "agent")
    who = request_principal(request)
    if who.read_user is not None and user_id and user_id != who.read_user:
        return {"sessions": [], "next_cursor": ""}  # an isolated member sees no other user's (SPEC 8)
    wanted = SessionFilter(
        user_id=who.read_user or user_id,
        agent=agent,
        metadata=query_object(metadata, "metadata"),
        active_after=query_time(active_after, "active_after"),
        active_before=query_time(active_before, "active_before"),
    )
    page = sessions_page(tenant_id=who.read_tenant, f=wanted, limit=limit, cursor=cursor)
    return {"sessions": page.sessions, "next_cursor": page.next_cursor}


@router.get(
    "/runs/{run_id}/webhooks",
    response={200: WebhookDeliveriesOut, 400: ErrorOut, 404: ErrorOut},
    summary="A run's completion-webhook deliveries: state, attempts, last answer",
)
def runs_webhooks(request: HttpRequest, run_id: str) -> dict[str, Any]:
    _ident(run_id, "run_id")
    who = request_principal(request)
    run = selectors.run_get(tenant_id=who.read_tenant, run_id=run_id, owner=who.read_user)
    return {"deliveries": deliveries_of(run_id=run.id)}
