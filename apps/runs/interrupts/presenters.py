"""Interrupts as the wire shows them: a row in the inbox, and the `interruption` object of an
`interruption_pending` event (SPEC 3)."""

from __future__ import annotations

from typing import Any

from apps.core.timefmt import ts
from apps.runs.models import Interrupt


def interrupt_out(row: Interrupt) -> dict[str, Any]:
    """One interrupt as `GET /v1/runs/{id}/interrupts` and the user inbox list it."""
    return {
        "interrupt_id": row.id,
        "run_id": row.run_id,
        "agent_id": row.agent_id,
        "agent": row.agent_name,
        "user_id": row.user_id,
        "kind": row.kind,
        "status": row.status,
        "question": row.question,
        "options": row.options,
        "context": row.context_data,
        "priority": row.priority,
        "answer": row.answer,
        "note": row.note,
        "resolved_by": row.resolved_by,
        "created_at": ts(row.created_at),
        "expires_at": ts(row.expires_at),
        "resolved_at": ts(row.resolved_at),
    }


def interruption_event(row: Interrupt) -> dict[str, Any]:
    """The `interruption` object of an `interruption_pending` event (SPEC 3, events table)."""
    return {
        "interrupt_id": row.id,
        "kind": row.kind,
        "question": row.question,
        "options": row.options,
        "context": row.context_data,
        "priority": row.priority,
        "expires_at": ts(row.expires_at),
    }
