"""The per-request run options loomcycle defines on `POST /v1/runs` and
`POST /v1/sessions/{id}/messages` (SPEC 2.3): `sampling`, `compaction`,
`parent_context`, `web_search_filter`, `run_timeout_seconds`; and the
`capability_inert` report of everything a run is given that it does not act on.

Invariants:
- A request's `sampling` and `compaction` overlay the agent's own blocks, key by
  key, and are pinned in the run's routing at creation (the engine reads only
  the routing); sub-agents inherit the pinned compaction as before.
- `parent_context` is the caller's opaque lineage: stored on the run, returned
  where SPEC returns it, inherited by the run's sub-agents.
- No silent drops: a field the runtime stores but does not act on, when set, and
  a sampling knob a candidate provider's API has no field for are each announced
  by one `capability_inert` event at run start (loomcycle's event:
  `{tool, gate, message}`; here `gate` names the field, `tool` the tool it would
  govern, "" for none, and `source` says where it was set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from apps.runs.models import Run

MAX_PARENT_CONTEXT_BYTES = 4096
PARENT_CONTEXT_KEYS = ("root_agent_run_id", "function_key", "tier_at_run")


class SamplingIn(BaseModel):
    """SPEC 2.3 `sampling{temperature,top_p,top_k,frequency_penalty,presence_penalty,seed,stop}`."""

    model_config = ConfigDict(extra="forbid")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: Annotated[str, Field(max_length=1024)] | Annotated[list[str], Field(max_length=16)] | None = None


class CompactionIn(BaseModel):
    """SPEC 2.3 `compaction{enabled,target_percentage,keep_last_n,keep_first,autocompact_at_pct,model,memory_flush}`."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    target_percentage: int | None = Field(default=None, ge=1, le=100)
    keep_last_n: int | None = Field(default=None, ge=1, le=1000)
    keep_first: bool | None = None
    autocompact_at_pct: int | None = Field(default=None, ge=1, le=100)
    model: str | None = Field(default=None, max_length=256)
    memory_flush: bool | None = None  # accepted and announced inert (docs/compat.md)


class ParentContextIn(BaseModel):
    """SPEC 2.3 `parent_context{root_agent_run_id,function_key,tier_at_run,board_*}`: text values only."""

    model_config = ConfigDict(extra="allow")
    root_agent_run_id: str | None = Field(default=None, max_length=256)
    function_key: str | None = Field(default=None, max_length=256)
    tier_at_run: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _board_only(self) -> ParentContextIn:
        for key, value in (self.model_extra or {}).items():
            if not key.startswith("board_"):
                raise ValueError(
                    f"parent_context: unknown field {key!r} (known: {', '.join(PARENT_CONTEXT_KEYS)}, board_*)"
                )
            if not isinstance(value, str):
                raise ValueError(f"parent_context.{key} must be a string")
        if len(json.dumps(self.model_dump(exclude_none=True))) > MAX_PARENT_CONTEXT_BYTES:
            raise ValueError(f"parent_context is over {MAX_PARENT_CONTEXT_BYTES} bytes")
        return self


@dataclass(frozen=True)
class RunOptions:
    """What a request adds to its agent's settings (all empty: the agent's alone)."""

    sampling: dict[str, Any] = field(default_factory=dict)
    compaction: dict[str, Any] = field(default_factory=dict)
    parent_context: dict[str, Any] | None = None
    web_search_filter: str | None = None  # drop | keep: WebSearch's filter when allowed_hosts narrows
    inert: dict[str, Any] = field(default_factory=dict)  # request fields set that the runtime does not act on


def options_of(
    *,
    sampling: SamplingIn | None,
    compaction: CompactionIn | None,
    parent_context: ParentContextIn | None,
    web_search_filter: Literal["drop", "keep"] | None,
    run_timeout_seconds: int | None,
) -> RunOptions:
    """The service's options from a run request's fields."""
    inert = {"run_timeout_seconds": run_timeout_seconds}
    return RunOptions(
        sampling=sampling.model_dump(exclude_none=True) if sampling else {},
        compaction=compaction.model_dump(exclude_none=True) if compaction else {},
        parent_context=parent_context.model_dump(exclude_none=True) if parent_context else None,
        web_search_filter=web_search_filter,
        inert={k: v for k, v in inert.items() if v is not None},
    )


def routing_with(routing: dict[str, Any], options: RunOptions, *, narrowed: bool = False) -> dict[str, Any]:
    """The run's pinned routing with the request's sampling and compaction laid over the agent's,
    and, when the caller narrowed `allowed_hosts`, WebSearch's host filter (default drop)."""
    out = dict(routing)
    if narrowed:
        out["web_search_filter"] = options.web_search_filter or "drop"
    if options.sampling:
        out["sampling"] = {**(routing.get("sampling") or {}), **options.sampling}
    compaction = {k: v for k, v in options.compaction.items() if k != "memory_flush"}
    if compaction:
        out["compaction"] = {**(routing.get("compaction") or {}), **compaction}
    return out


def parent_context_for(options: RunOptions, parent_id: str | None) -> dict[str, Any] | None:
    """The request's own, else (a sub-agent) its parent's: a child inherits the lineage (SPEC 4.8)."""
    if options.parent_context is not None or parent_id is None:
        return options.parent_context
    found: dict[str, Any] | None = Run.objects.filter(id=parent_id).values_list("parent_context", flat=True).first()
    return found
