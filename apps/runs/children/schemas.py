"""`POST /v1/runs:batch` bodies (SPEC 2.3): each spawn is a `POST /v1/runs`
body, its `parent_context` also passed through to its result entry."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from apps.runs.children import batch, fanout
from apps.runs.schemas import RunCreateIn


class BatchSpawnIn(RunCreateIn):
    """A `POST /v1/runs` body; its `parent_context` (RunCreateIn's) is also echoed in its result entry."""


class BatchIn(BaseModel):
    # The 1..32 bound is the service's (400 `invalid_spawns`, naming the limit); the schema documents it.
    spawns: list[BatchSpawnIn] = Field(
        default_factory=list, max_length=1024, json_schema_extra={"minItems": 1, "maxItems": fanout.MAX_SPAWNS}
    )
    mode: str = Field(default="join", json_schema_extra={"enum": list(batch.MODES)})
    timeout_ms: int | None = Field(default=None, ge=1)
    model_config = {"extra": "ignore"}

    def timeout(self) -> int:
        """The wait in ms: the request's, default 5 min, at most 30 min."""
        return min(self.timeout_ms or batch.DEFAULT_TIMEOUT_MS, batch.MAX_TIMEOUT_MS)


class BatchResultOut(BaseModel):
    """One child's entry (SPEC 4.9's RunOnce result plus `parent_context`)."""

    agent_id: str
    run_id: str
    session_id: str
    status: str
    stop_reason: str
    final_text: str
    usage: dict[str, Any]
    error: str
    limits: dict[str, Any] | None = None
    parent_context: dict[str, Any] | None = None


class BatchOut(BaseModel):
    results: list[BatchResultOut]
    spawned: int
    timed_out: bool | None = None  # present (true) only when the wait timed out
