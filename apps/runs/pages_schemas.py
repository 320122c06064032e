"""Response schemas of the integration routes (issue 38): run pages, children, sessions, the
per-user run-state stream's frames, webhook deliveries. Their error body is the one every route
shares (loomcycle_project.openapi's `Error`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class RunRowOut(BaseModel):
    """A run as GET /v1/runs/{id} shows it (apps.runs.presenters.agent_out), plus its tenant."""

    model_config = ConfigDict(extra="allow")
    agent_id: str
    run_id: str
    session_id: str
    agent: str
    user_id: str
    parent_agent_id: str | None = None
    status: str
    state: str
    started_at: str | None = None
    completed_at: str | None = None
    stop_reason: str = ""
    error: str = ""
    usage: dict[str, Any] = {}
    tenant_id: str = ""


class RunsPageOut(BaseModel):
    runs: list[RunRowOut]
    next_cursor: str  # "" on the last page


class ChildrenPageOut(BaseModel):
    agents: list[RunRowOut]
    next_cursor: str


class SessionOut(BaseModel):
    session_id: str
    agent: str
    user_id: str
    title: str
    created_at: str
    last_activity_at: str
    run_count: int
    last_run_id: str
    status: str  # the latest run's (running for any live state)
    metadata: dict[str, Any]


class SessionsPageOut(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str


class RunStateOut(BaseModel):
    """The data of a `run_state` frame of GET /v1/users/{user_id}/agents/stream (SPEC 2.3)."""

    run_id: str
    agent_id: str
    agent: str
    user_id: str
    parent_agent_id: str | None = None
    status: str
    stop_reason: str = ""
    error: str = ""
    ts: str
    parent_context: dict[str, Any] | None = None


class WebhookDeliveryOut(BaseModel):
    id: str  # the idempotency id the receiver sees as `webhook-id`
    run_id: str
    event: str
    url: str
    state: str  # pending | delivered | failed
    attempts: int
    last_status: int | None = None
    last_error: str = ""
    created_at: str
    next_attempt_at: str | None = None
    delivered_at: str | None = None


class WebhookDeliveriesOut(BaseModel):
    deliveries: list[WebhookDeliveryOut]
