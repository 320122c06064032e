"""`Interruption`: ask a human mid-run (SPEC 6.7), a thin adapter over the
interrupts table (apps.runs.store.interrupts) and the resolve services
(apps.runs.interrupts.services).

- Default-deny: the agent's `tools:` must list it AND its definition must set
  `interruption: {enabled: true}`; `interruption.kinds`, when set, must include
  `question` for `ask`. At most `interruption.max_pending` (else the operator's
  LOOMCYCLE_INTERRUPTION_MAX_PENDING) asks of one run are pending at once.
- `ask` PARKS the run (`awaiting_interrupt`, no worker held): the row is inserted
  in the parked step's own commit, with the `interruption_pending` event and the
  `interruption_pending` signal (bridged to `_system/interrupts/pending` when that
  channel is declared). A resolve (REST, the Django admin) or beat's expiry
  answers the call through apps.runs.wake.run_answer.
- `notify` does not park: it emits an `interruption_notify` event and returns.
- `cancel` is not offered (docs/compat.md): a run is parked while any ask of it is
  pending, so it never runs with one of its own to cancel.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from apps.core.ids import new_interrupt_id
from apps.core.redact import run_redactor
from apps.core.tools import Park, Tool, ToolContext, ToolRefusal, ToolResult, input_refusal
from apps.runs import selectors, signals, store
from apps.runs.interrupts.presenters import interruption_event
from apps.runs.interrupts.services import TOOL
from apps.runs.models import Interrupt, RunStatus
from apps.substrate.selectors import agent_definition

OPS = ("ask", "notify")
FIELDS = frozenset({"op", "question", "options", "context", "timeout_ms", "priority", "message"})
PRIORITIES = ("low", "normal", "high")
MAX_TEXT = 8192  # characters of a question or a notify message
MAX_OPTIONS = 32
MAX_CONTEXT_BYTES = 16384


def _acl(ctx: ToolContext) -> dict[str, Any]:
    """The agent's `interruption` block; refused unless it is enabled."""
    block = agent_definition(ctx.agent_def_id).get("interruption") or {}
    if not isinstance(block, dict) or block.get("enabled") is not True:
        raise ToolRefusal(
            "Interruption tool: this agent's definition does not enable it (set `interruption: {enabled: true}`)"
        )
    return block


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolRefusal(f"missing required field: {key}")
    if len(value) > MAX_TEXT:
        raise ToolRefusal(f"{key} is longer than {MAX_TEXT} characters")
    return value.strip()


def _priority(data: dict[str, Any]) -> str:
    value = data.get("priority") or "normal"
    if value not in PRIORITIES:
        raise ToolRefusal(f"priority must be one of {', '.join(PRIORITIES)}")
    return str(value)


def _options(data: dict[str, Any]) -> list[str]:
    value = data.get("options") or []
    if not isinstance(value, list) or not all(isinstance(o, str) and o for o in value):
        raise ToolRefusal("options must be a list of non-empty strings")
    if len(value) > MAX_OPTIONS or len(set(value)) != len(value):
        raise ToolRefusal(f"options must be at most {MAX_OPTIONS} distinct strings")
    return list(value)


def _timeout_ms(data: dict[str, Any]) -> int:
    conf = settings.LOOMCYCLE
    value = data.get("timeout_ms", conf.interruption_default_timeout_ms)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ToolRefusal("timeout_ms must be a positive integer")
    if value > conf.interruption_max_timeout_ms:
        raise ToolRefusal(f"timeout_ms must be at most {conf.interruption_max_timeout_ms}")
    return value


def _context(data: dict[str, Any]) -> Any:
    value = data.get("context")
    if value is not None and len(json.dumps(value)) > MAX_CONTEXT_BYTES:
        raise ToolRefusal(f"context is larger than {MAX_CONTEXT_BYTES} bytes of JSON")
    return value


def _max_pending(acl: dict[str, Any]) -> int:
    value = acl.get("max_pending")
    return value if isinstance(value, int) and value > 0 else int(settings.LOOMCYCLE.interruption_max_pending)


def _check_room(ctx: ToolContext, acl: dict[str, Any]) -> None:
    """Refuse this ask when it would make more than max_pending of the run's asks pending:
    those pending already, plus this step's asks made before it (the step's batch, in the
    model's order: parallel asks of one turn count each other in call order)."""
    cap = _max_pending(acl)
    pending = selectors.interrupt_pending_count(run_id=ctx.run_id)
    asks = [call_id for call_id, name, data in ctx.batch if name == TOOL and data.get("op") == "ask"]
    before = asks.index(ctx.call_id) if ctx.call_id in asks else len(asks)
    if pending + before >= cap:
        raise ToolRefusal(f"max_pending reached: this run may have at most {cap} pending interruption(s)")


def _ask(ctx: ToolContext, data: dict[str, Any], acl: dict[str, Any]) -> ToolResult:
    kinds = acl.get("kinds") or []
    if kinds and "question" not in kinds:
        raise ToolRefusal("Interruption tool: this agent's `interruption.kinds` does not include `question`")
    question, options, priority = _text(data, "question"), _options(data), _priority(data)
    timeout_ms, context = _timeout_ms(data), _context(data)
    _check_room(ctx, acl)
    redactor = run_redactor(ctx.credentials)  # the row is served to humans: stored as events are, redacted
    question, options, context = redactor.text(question), redactor.value(options), redactor.value(context)
    now = timezone.now()
    row = Interrupt(
        id=new_interrupt_id(),
        run_id=ctx.run_id,
        call_id=ctx.call_id,
        step=ctx.step,
        tenant_id=ctx.tenant_id,
        user_id=ctx.user_id,
        agent_id=ctx.agent_id,
        agent_name=ctx.agent_name,
        question=question,
        options=options,
        context_data=context,
        priority=priority,
        created_at=now,
        expires_at=now + timedelta(milliseconds=timeout_ms),
    )
    event = {"type": "interruption_pending", "interruption": interruption_event(row)}
    park = Park(status=RunStatus.AWAITING_INTERRUPT, record=partial(_record, row), after_commit=_nothing_to_recheck)
    return ToolResult(text="", park=park, events=(event,))


def _record(row: Interrupt, run_id: str, step: int, call_id: str) -> None:
    """Inside the parked step's commit: the row, and the signal sent once it commits."""
    store.interrupt_insert(row)
    signals.send_on_commit(
        signals.interruption_pending,
        run_id=run_id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        agent=row.agent_name,
        interruption=interruption_event(row),
    )


def _nothing_to_recheck(run_id: str, call_id: str) -> None:
    """After the park committed: nothing can have answered it first (no one could see the
    row before the commit), and a deadline already past is beat's to expire."""


def _notify(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    message, priority = _text(data, "message"), _priority(data)
    event = {
        "type": "interruption_notify",
        "interruption": {"kind": "notify", "message": message, "priority": priority},
    }
    return ToolResult(json.dumps({"notified": True, "priority": priority}), events=(event,))


def interruption_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    refused = input_refusal(data, OPS, FIELDS)
    if refused is not None:
        if data.get("op") == "cancel":
            return ToolResult(
                "op cancel is not supported here: the run stays parked while any ask of it is pending, "
                "so it never runs with one of its own to cancel",
                is_error=True,
            )
        return refused
    close_old_connections()
    try:
        acl = _acl(ctx)
        return _ask(ctx, data, acl) if data["op"] == "ask" else _notify(ctx, data)
    except ToolRefusal as exc:
        return ToolResult(str(exc), is_error=True)
    finally:
        connection.close()  # back to the pool: tools run on short-lived threads


INTERRUPTION_TOOL = Tool(
    name=TOOL,
    description=(
        "Ask a human and wait for the answer (op=ask: question, options?, context?, timeout_ms?, priority?); "
        "the run pauses until someone answers, declines, or the timeout passes. "
        "op=notify (message, priority?) tells the human something without waiting."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(OPS)},
            "question": {"type": "string"},
            "options": {"type": "array", "items": {"type": "string"}},
            "context": {},
            "timeout_ms": {"type": "integer", "minimum": 1},
            "priority": {"type": "string", "enum": list(PRIORITIES)},
            "message": {"type": "string"},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=interruption_execute,
)
