"""Response schemas of the interrupt, compaction, turn-cancel, fork and transcript routes for
/v1/openapi.json. The routes answer with the dicts their services and presenters build
(apps.runs.interrupts.presenters, compaction.services, engine.turncancel, fork, sessions.services);
these models document them (tests/core/test_api_fuzz.py checks answers against the schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class InterruptOut(BaseModel):
    interrupt_id: str
    run_id: str
    agent_id: str
    agent: str
    user_id: str
    kind: str
    status: str
    question: str
    options: list[Any]  # [] = any answer
    context: Any
    priority: str  # low | normal | high
    answer: Any
    note: str
    resolved_by: str
    created_at: str | None
    expires_at: str | None
    resolved_at: str | None


class RunInterruptsOut(BaseModel):
    run_id: str
    interrupts: list[InterruptOut]


class UserInterruptsOut(BaseModel):
    user_id: str
    interrupts: list[InterruptOut]


class InterruptResolvedOut(BaseModel):
    interrupt_id: str
    status: str  # answered | declined
    resolved_at: str | None


class RunCompactQueuedOut(BaseModel):
    """202: the compaction is queued for the run's next iteration (`applied` and `compacted` are false here)."""

    run_id: str
    queued: bool
    duplicate: bool  # one was already queued
    applied: bool
    compacted: bool


class TurnCancelledOut(BaseModel):
    run_id: str
    stopped: bool
    parked: bool
    reason: str


class RunForkedOut(BaseModel):
    agent_id: str
    run_id: str
    session_id: str
    status: str
    forked_from_run: str | None
    forked_at_step: int | None


class TranscriptSessionOut(BaseModel):
    id: str
    tenant_id: str
    agent: str
    user_id: str
    created_at: str | None


class TranscriptRunOut(BaseModel):
    run_id: str
    agent_id: str
    agent: str
    turn: int
    state: str
    replays_session: bool
    rolled_back: bool


class TranscriptEventOut(BaseModel):
    seq: int
    run_id: str
    ts_ns: int
    type: str
    event: Any
    payload: Any = None  # present for user_input and system_prompt: the payload as recorded


class SessionTranscriptOut(BaseModel):
    session: TranscriptSessionOut
    runs: list[TranscriptRunOut]
    events: list[TranscriptEventOut]
