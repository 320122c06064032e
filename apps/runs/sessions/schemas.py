"""Pydantic schemas of the session routes (SPEC 2.3)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator, model_validator

from apps.core.ids import IDENT_RE
from apps.runs.schemas import IDENT_PATTERN, RunCreateIn

# What the session decides for a continuation: a body naming one is refused, not ignored.
_SESSION_FIXED = ("agent", "session_id", "user_id", "tenant_id")


class SessionMessageIn(RunCreateIn):
    """POST /v1/sessions/{id}/messages: POST /v1/runs's body (segments or prompt,
    tools, allowed_hosts, agent_id, user_tier, credentials, metadata, interactive,
    max_iterations, background, cancel_on_disconnect, multitask_strategy) less the
    session's own agent, user and id."""

    agent: str | None = None  # type: ignore[assignment]  # the session's: refused when given

    @model_validator(mode="after")
    def _fixed_by_session(self) -> SessionMessageIn:
        for name in _SESSION_FIXED:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is the session's own; omit it")
        return self


class SessionReplayIn(BaseModel):
    """POST /v1/sessions/{id}/replay: the new session's agent (the source session's when omitted)."""

    agent: str | None = Field(default=None, min_length=1, max_length=128, json_schema_extra={"pattern": IDENT_PATTERN})
    model_config = {"extra": "forbid"}

    @field_validator("agent")
    @classmethod
    def _agent(cls, v: str | None) -> str | None:
        if v is not None and not IDENT_RE.fullmatch(v):
            raise ValueError("agent must match [A-Za-z0-9_-]{1,128}")
        return v


class SessionReplayOut(BaseModel):
    new_session_id: str
    seed_run_id: str
    events_copied: int
    compacted: bool
