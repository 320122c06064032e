"""Compaction inside an iteration (docs/compaction.md): whether this iteration
compacts, the summary request, and the marker and event it commits.

Three triggers, one path: a manual request (POST /v1/runs/{id}/compact) and a
self request (the Context tool's `compact` op) are RunInput rows of their own
`source`, drained with the iteration's other inputs; the automatic trigger is
the estimated size of the next model request past the agent's
`autocompact_at_pct` of the model's window (apps.gateway.windows). The engine
makes the one summary call (with its retries) and commits the marker row and
the `context_compaction` event with the step, in its fenced commit: a lost
fence discards the compaction with the rest of the iteration.

Settings come from the run's pinned routing (`routing["compaction"]`, set at
creation from the agent's `compaction` block or, when it has none, its
parent's: apps.runs.compaction.services.compaction_routing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from apps.gateway.providers import PURPOSE_COMPACTION, ProviderError, ProviderRequest
from apps.gateway.windows import context_window, estimate_tokens
from apps.runs.compacted import Cut, Entry, Row, after_view, choose_cut, marker_row, render, visible
from apps.runs.store import ClaimedRun

SOURCE_MANUAL = "compact"  # RunInput.source of a POST /v1/runs/{id}/compact
SOURCE_SELF = "compact:self"  # RunInput.source of a Context op=compact
SOURCES = (SOURCE_MANUAL, SOURCE_SELF)
DEFAULT_KEEP_N = 2
SUMMARY_MAX_TOKENS = 2048
SUMMARY_SYSTEM = (
    "You compact a conversation between a user and an AI agent so that the agent can go on "
    "without the full history. Write a concise summary of everything the agent needs to continue: "
    "the user's goals and constraints, decisions made, facts learned, tool calls made and what they "
    "returned, and open questions. Write only the summary."
)
SUMMARY_PROMPT = "The conversation so far:\n\n{transcript}\n\nSummarise it as instructed."


class Trigger(StrEnum):
    MANUAL = "manual"
    SELF = "self"
    AUTO = "auto"


@dataclass(frozen=True)
class Request:
    """A queued request (manual or self), with its one-off overrides."""

    trigger: Trigger
    keep_last_n: int | None = None
    keep_first: bool | None = None


@dataclass(frozen=True)
class Settings:
    """An agent's `compaction` block with its defaults (SPEC 5.1 field names).
    Percentages of 0 are off; `memory_flush` is not acted on (docs/compat.md)."""

    enabled: bool = True
    autocompact_at_pct: int = 0
    target_percentage: int = 0
    keep_last_n: int = DEFAULT_KEEP_N
    keep_first: bool = False
    model: str = ""

    @classmethod
    def of(cls, routing: dict[str, Any] | None) -> Settings:
        block = (routing or {}).get("compaction") or {}
        return cls(
            enabled=block.get("enabled") is not False,
            autocompact_at_pct=_int(block.get("autocompact_at_pct")),
            target_percentage=_int(block.get("target_percentage")),
            keep_last_n=_int(block.get("keep_last_n")) or DEFAULT_KEEP_N,
            keep_first=block.get("keep_first") is True,
            model=str(block.get("model") or ""),
        )


def _int(value: Any) -> int:
    """A setting's integer; 0 (off, or the default) for anything else: definitions are checked
    when loaded (apps.substrate.kinds), but a row stored before that check may hold anything."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Plan:
    """A compaction this iteration makes: the cut and the summary call."""

    trigger: Trigger
    cut: Cut
    keep_n: int
    before_tokens: int
    request: ProviderRequest


@dataclass(frozen=True)
class Skipped:
    """A requested compaction with nothing to summarise (recorded as an event)."""

    trigger: Trigger
    reason: str


def is_request(source: str) -> bool:
    return source in SOURCES


def request_of(source: str, text: str) -> Request:
    """A drained request row: its trigger from `source`, its overrides from `text` (JSON or empty)."""
    params: dict[str, Any] = json.loads(text) if text.strip() else {}
    trigger = Trigger.SELF if source == SOURCE_SELF else Trigger.MANUAL
    keep_n = params.get("keep_last_n")
    keep_first = params.get("keep_first")
    return Request(
        trigger,
        int(keep_n) if isinstance(keep_n, int) else None,
        bool(keep_first) if isinstance(keep_first, bool) else None,
    )


def plan(run: ClaimedRun, rows: list[Row], requests: list[Request]) -> Plan | Skipped | None:
    """What this iteration does about compaction (before its model call); None: nothing."""
    settings = Settings.of(run.routing)
    request = requests[-1] if requests else None
    # Every iteration passes here: with nothing asked and no automatic trigger, nothing is computed.
    if not settings.enabled or (request is None and not settings.autocompact_at_pct):
        return None
    view = visible(rows)
    before = estimate_tokens(run.system, _messages(view))
    window = context_window(run.provider)
    if request is None and before * 100 <= window * settings.autocompact_at_pct:
        return None
    trigger = request.trigger if request else Trigger.AUTO
    keep_n = (request.keep_last_n if request else None) or settings.keep_last_n
    keep_first = settings.keep_first if request is None or request.keep_first is None else request.keep_first

    def fits(kept: list[Entry]) -> bool:
        return estimate_tokens(run.system, _messages(kept)) * 100 <= window * settings.target_percentage

    cut = choose_cut(view, keep_n=keep_n, keep_first=keep_first, fits=fits if settings.target_percentage else None)
    if cut is None:
        return None if trigger == Trigger.AUTO else Skipped(trigger, "no earlier turn to summarise")
    return Plan(trigger, cut, keep_n, before, _summary_request(run, settings, cut))


def _summary_request(run: ClaimedRun, settings: Settings, cut: Cut) -> ProviderRequest:
    text = SUMMARY_PROMPT.format(transcript=render(cut.summarised))
    return ProviderRequest(
        model=settings.model or run.model,
        system=[SUMMARY_SYSTEM],
        messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
        max_tokens=min(run.max_tokens, SUMMARY_MAX_TOKENS),
        run_id=run.id,
        purpose=PURPOSE_COMPACTION,
    )


def applied(run: ClaimedRun, p: Plan, summary: str, marker_idx: int) -> tuple[Row, dict[str, Any]]:
    """The marker row (appended at `marker_idx`) and the `context_compaction` event."""
    after = estimate_tokens(run.system, _messages(after_view(p.cut, summary)))
    marker = marker_row(
        summary=summary,
        cut=p.cut,
        marker_idx=marker_idx,
        keep_n=p.keep_n,
        trigger=p.trigger.value,
        before_tokens=p.before_tokens,
        after_tokens=after,
    )
    info = {
        "summary": summary,
        "before_tokens": p.before_tokens,
        "after_tokens": after,
        "keep_n": p.keep_n,
        "keep_first": p.cut.lead == 1,
        "trigger": p.trigger.value,
        "kept_rows": marker[1][0]["kept_rows"],
    }
    return marker, {"type": "context_compaction", "context_compaction": info}


def skipped_event(s: Skipped) -> dict[str, Any]:
    return {"type": "context_compaction_skipped", "trigger": s.trigger.value, "text": s.reason}


def failed_event(p: Plan, exc: ProviderError) -> dict[str, Any]:
    return {
        "type": "context_compaction_failed",
        "trigger": p.trigger.value,
        "error": f"the summary call failed, the history was left as it was: {exc}",
    }


def only_compacts(run: ClaimedRun, rows: list[Row], requests: list[Request]) -> bool:
    """Whether this wake was for a compaction alone: an interactive run between turns
    (its last row a model turn that called no tool) with a request and no new input.
    Such an iteration compacts and parks again, without a model call."""
    if not run.interactive or not requests or not rows:
        return False
    role, content = rows[-1]
    return role == "assistant" and not any(b.get("type") == "tool_use" for b in content)


def _messages(view: list[Entry]) -> list[dict[str, Any]]:
    return [{"role": e.role, "content": e.content} for e in view]
