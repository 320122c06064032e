"""Pydantic schemas of the runs API (SPEC 2.3 field names)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from apps.core.hosts import host_entry_error
from apps.core.ids import IDENT_RE
from apps.runs.completion.spec import WebhookIn
from apps.runs.prompt import Segment, parse_segments
from apps.runs.run_options import CompactionIn, ParentContextIn, RunOptions, SamplingIn, options_of

IDENT_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"  # IDENT_RE, anchored, as the OpenAPI schema states it


def _ident(value: str | None, field: str) -> str | None:
    if value is not None and not IDENT_RE.fullmatch(value):
        raise ValueError(f"{field} must match [A-Za-z0-9_-]{{1,128}}")
    return value


class RunCreateIn(BaseModel):
    agent: str = Field(min_length=1, max_length=128, json_schema_extra={"pattern": IDENT_PATTERN})
    prompt: str | None = None
    # loomcycle's nested segments or the flat shape: apps.runs.prompt.parse_segments, the one parser.
    segments: list[Segment] | None = None
    tools: list[str] | None = None
    # SPEC 6.1: omitted/null = the operator's hosts, [] = no network, a list = operator ∩ caller.
    allowed_hosts: list[str] | None = Field(default=None, max_length=256)
    user_id: str | None = Field(default=None, json_schema_extra={"pattern": IDENT_PATTERN})
    tenant_id: str | None = Field(default=None, max_length=128)  # the token's tenant wins (SPEC 8)
    agent_id: str | None = Field(default=None, json_schema_extra={"pattern": IDENT_PATTERN})
    metadata: dict[str, Any] | None = None
    interactive: bool | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=2**20)
    user_tier: str | None = Field(default=None, max_length=64)
    # Append to this session, without replaying it (SPEC 4.5).
    session_id: str | None = Field(default=None, json_schema_extra={"pattern": IDENT_PATTERN})
    # With session_id, when the session has a run in flight: reject | enqueue | interrupt | rollback
    # (apps.runs.sessions; checked by backpressure.strategy_of: 422 invalid_multitask_strategy).
    multitask_strategy: str | None = Field(
        default=None, max_length=32, description="reject (default) | enqueue | interrupt | rollback"
    )
    # Checked by apps.runs.credentials (400 invalid_credentials), so typed loosely here; never echoed.
    user_bearer: Any = Field(default=None, repr=False)
    user_credentials: dict[str, Any] | None = Field(default=None, repr=False)
    background: bool = False
    cancel_on_disconnect: bool = False
    # loomcycle's per-request options (apps.runs.run_options; inert ones announced at run start).
    sampling: SamplingIn | None = None
    compaction: CompactionIn | None = None
    parent_context: ParentContextIn | None = None
    web_search_filter: Literal["drop", "keep"] | None = None
    run_timeout_seconds: int | None = Field(default=None, ge=1)
    # "" / "default": kept for the retention age (docs/operations.md, "Data lifecycle");
    # "no_trace": the run's tree is deleted as soon as it ends.
    retention: Literal["", "default", "no_trace"] | None = None
    # Called back when the run ends (apps.runs.completion; docs/api.md "Completion webhooks").
    webhook: WebhookIn | None = None
    model_config = {"extra": "ignore"}

    def options(self) -> RunOptions:
        return options_of(
            sampling=self.sampling,
            compaction=self.compaction,
            parent_context=self.parent_context,
            web_search_filter=self.web_search_filter,
            run_timeout_seconds=self.run_timeout_seconds,
        )

    @field_validator("agent")
    @classmethod
    def _agent(cls, v: str) -> str:
        return _ident(v, "agent") or v

    @field_validator("segments", mode="before")
    @classmethod
    def _segments(cls, v: Any) -> list[Segment] | None:
        # Its refusals are ApplicationErrors (400 with their own codes), which pydantic lets through.
        return None if v is None else parse_segments(v)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        for entry in v or []:
            error = host_entry_error(entry)
            if error:
                raise ValueError(error)
        return v

    @field_validator("user_id")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return _ident(v, "user_id")

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, v: str | None) -> str | None:
        return _ident(v, "agent_id")

    @field_validator("session_id")
    @classmethod
    def _session(cls, v: str | None) -> str | None:
        return _ident(v, "session_id")

    def segment_list(self) -> list[Segment]:
        if self.segments:
            return self.segments
        return [Segment(role="user", type="trusted-text", text=self.prompt or "")]


class RunCreatedOut(BaseModel):
    agent_id: str
    run_id: str
    session_id: str
    status: str


class CancelIn(BaseModel):
    reason: str = Field(default="", max_length=1024)


class InputIn(BaseModel):
    # Documented non-empty: the route refuses "" itself (422 empty_input).
    text: str = Field(max_length=1024 * 1024, json_schema_extra={"minLength": 1})


class PauseIn(BaseModel):
    timeout_ms: int = Field(default=30_000, ge=0, le=300_000)


class EventOut(BaseModel):
    seq: int
    step: int  # the iteration that appended the event
    type: str
    payload: Any
    created_at: str
    worker_version: str  # the code version of the worker that ran that iteration ("" outside one)


class EventsOut(BaseModel):
    run_id: str
    events: list[EventOut]
    last_seq: int
    status: str
    state: str


class InterruptResolveIn(BaseModel):
    """`POST /v1/runs/{run_id}/interrupts/{interrupt_id}/resolve` (SPEC 2.3). The checks against
    the interrupt itself (kind, disposition, options) are the service's: 422 there."""

    answer: Any = None
    disposition: str = Field(default="answer", max_length=32)
    kind: str | None = Field(default=None, max_length=32)
    resolved_by: str = Field(default="api", min_length=1, max_length=128)
    note: str = Field(default="", max_length=8192)
    model_config = {"extra": "forbid"}


class RunCompactIn(BaseModel):
    """POST /v1/runs/{id}/compact (optional body): one-off overrides of the agent's compaction settings."""

    keep_last_n: int | None = Field(default=None, ge=1, le=1000)
    keep_first: bool | None = None


class TurnCancelIn(BaseModel):
    """`POST /v1/runs/{run_id}/cancel` (SPEC 2.3): turn-cancel of an interactive run."""

    reason: str = Field(default="", max_length=1024)
    model_config = {"extra": "forbid"}


class ForkIn(BaseModel):
    """`POST /v1/runs/{run_id}/fork`: a new run in a new session from the run's
    transcript up to and including iteration `from_step` (apps.runs.fork)."""

    from_step: int  # range-checked by the service against the run (422 step_out_of_range)
    agent: str | None = Field(default=None, pattern=IDENT_PATTERN)
    prompt: str | None = Field(default=None, min_length=1, max_length=1024 * 1024)
    interactive: bool | None = None
    agent_id: str | None = Field(default=None, pattern=IDENT_PATTERN)
    model_config = {"extra": "forbid"}


class RunTreeDeletedOut(BaseModel):
    """DELETE /v1/runs/{run_id} (apps.runs.deletion)."""

    run_id: str
    session_id: str
    deleted: bool  # False: the tree was live; it is cancelled and deleted when it ends (202)
    deleted_runs: int
    counts: dict[str, int]  # rows removed per table
    deleting: bool
    kept: dict[str, str]  # what stays, and why


class RunOut(BaseModel):
    """A run as GET /v1/runs/{run_id} and /v1/agents/{agent_id} answer it (apps.runs.presenters.agent_out).
    Extra fields pass through: a field added to the presenter reaches clients before this lists it."""

    model_config = {"extra": "allow"}

    agent_id: str
    run_id: str
    session_id: str
    agent: str
    user_id: str
    parent_agent_id: str | None
    parent_context: Any = None
    status: str  # running (any live state) | completed | failed | cancelled | ...
    state: str  # the exact RunStatus
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
    agent_def_id: str | None = None
    content_sha256: str
    last_seq: int
    forked_from_run: str | None
    forked_at_step: int | None


class TenantRunOut(RunOut):
    tenant_id: str


class RunsOut(BaseModel):
    model_config = {"extra": "allow"}  # paging fields beside `runs`

    runs: list[TenantRunOut]


class AgentsOut(BaseModel):
    model_config = {"extra": "allow"}

    agents: list[RunOut]


class RunCancelOut(BaseModel):
    """POST /v1/agents/{agent_id}/cancel: `cancelled` false (with the run's status) for a finished run."""

    model_config = {"extra": "allow"}

    cancelled: bool
    agent_id: str
    status: str | None = None  # a finished run's
    cascaded: list[str] | None = None  # the live descendants cancelled with it
    reason: str | None = None


class RunInputOut(BaseModel):
    run_id: str
    delivered: bool


class RuntimeStateOut(BaseModel):
    state: str  # running | pausing | paused
    paused_runs_count: int


class RuntimePauseOut(BaseModel):
    model_config = {"extra": "allow"}

    state: str
    duration_ms: int
    force_cancelled_count: int
    paused_runs_count: int
    warnings: list[str]


class RuntimeResumeOut(BaseModel):
    model_config = {"extra": "allow"}

    state: str
    resumed_runs_count: int
    warnings: list[str]
