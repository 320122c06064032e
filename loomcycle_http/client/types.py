"""Typed results of the client: TypedDicts of the API's JSON bodies (plain dicts at run time, so a
field the server adds later reaches the caller; type checkers see the documented ones). Their
fields are the OpenAPI components of /v1/openapi.json (apps.runs.schemas.RunOut, ...)."""

from typing import Any, NotRequired, TypedDict


class Run(TypedDict):
    """GET /v1/runs/{run_id}, /v1/agents/{agent_id}: one run."""

    agent_id: str
    run_id: str
    session_id: str
    agent: str
    user_id: str
    parent_agent_id: str | None
    parent_context: Any
    status: str  # running (any live state) | completed | failed | cancelled | ...
    state: str  # the exact state
    step: int
    started_at: str | None
    completed_at: str | None
    stop_reason: str
    error: str
    usage: dict[str, Any]
    last_heartbeat_at: str | None
    live: bool
    interactive: bool
    awaited_state: str
    awaited_on: str
    resident: bool
    resident_state: str
    agent_def_id: str | None
    content_sha256: str
    last_seq: int
    forked_from_run: str | None
    forked_at_step: int | None
    tenant_id: NotRequired[str]  # in GET /v1/runs
