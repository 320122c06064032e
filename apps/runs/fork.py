"""Fork a run from a step (`POST /v1/runs/{run_id}/fork`; beyond loomcycle, as
LangGraph's time travel): a NEW run in a NEW session whose history is the
source run's transcript through iteration `from_step`.

"Step N" is the run's iteration N (0-based; `step` of its transcript rows):
iteration 0's rows are the run's first user message and the model's first
reply; iteration N's are the input drained at its top (steering, the next
user turn of an interactive run), the model's reply, and the results of that
reply's tool calls (those answered later, by a child or a human, are stored at
the call's step too). The cut keeps every row of iterations 0..N, in order.

Invariants:
- the cut never leaves a tool_use without its tool_result (422
  `split_tool_pair`: iteration N still waits for a call's answer);
- 0 <= from_step < the source's committed iterations (422 `step_out_of_range`);
- the source is read as the caller may see it (another tenant's run: 404), and
  only in the caller's own tenant: an admin credential reads every tenant, but
  forking another tenant's run would copy its transcript into the admin's
  tenant, so that is a 404 too. The fork belongs to that tenant; it starts
  through `run_create` (the same admission, fairness and doorbell, and the
  same identity rule: the source's user is kept only for a caller that may name
  the user, apps.core.identity, else the fork is the caller's own), and records
  its lineage (`forked_from_run`, `forked_at_step`) and a `forked` event;
- a cut that ends on the model's own turn needs a next user turn: `prompt`
  gives it; without one an interactive fork starts parked at
  `awaiting_input` (outside the admission queue: apps.runs.services), a
  non-interactive one is refused (422 `prompt_required`);
- a continuation run (`replays_session`) is forked with the session history it
  was built on: the rows its model saw before its own (sessions.replayed_history,
  as the engine's `_load_rows` reads them) come first, then its own rows through
  `from_step`.
The fork carries no credentials (`user_bearer`, `user_credentials`), and its
system prompt is its agent's own: the source's request system segments and
metadata are not copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.core.errors import NotFound, Unprocessable
from apps.core.types import Principal
from apps.runs.create import RunCreate, Seed, run_create
from apps.runs.models import Run
from apps.runs.prompt import Segment
from apps.runs.selectors import run_get, run_transcript_through
from apps.runs.sessions.replay import replayed_history


@dataclass(frozen=True)
class ForkRequest:
    from_step: int
    agent: str | None = None
    prompt: str | None = None
    interactive: bool | None = None
    agent_id: str | None = None


def run_fork(*, principal: Principal, run_id: str, request: ForkRequest) -> Run:
    """Start the fork of `run_id` at `request.from_step` (the module's invariants)."""
    source = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    if source.tenant_id != principal.tenant_id:  # an admin reading across tenants: never copy a transcript over
        raise NotFound(f"unknown run {run_id}", code="not_found")
    history = fork_history(source=source, from_step=request.from_step)
    interactive = source.interactive if request.interactive is None else request.interactive
    ends_turn = history[-1][0] == "assistant"
    if ends_turn and not request.prompt and not interactive:
        raise Unprocessable(
            f"step {request.from_step} ends on the model's turn; give a prompt for the fork's next user turn",
            code="prompt_required",
        )
    parked = ends_turn and not request.prompt
    data = RunCreate(
        agent=request.agent or source.agent_name,
        segments=[Segment(text=request.prompt)] if request.prompt else [],
        tools=source.caller_tools,
        allowed_hosts=list(source.allowed_hosts),
        user_id=source.user_id,
        agent_id=request.agent_id,
        interactive=interactive,
        seed=Seed(
            history=history,
            events=[_forked_event(source, request.from_step, len(history))],
            from_run_id=source.id,
            at_step=request.from_step,
            parked=parked,
        ),
    )
    return run_create(principal=principal, data=data)


def fork_history(*, source: Run, from_step: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """The source's transcript through iteration `from_step`; 422 when the step is
    not one the run committed or the cut would split a tool_use from its result."""
    if not 0 <= from_step < source.step:
        raise Unprocessable(
            f"from_step {from_step} is out of range: run {source.id} has committed steps 0..{source.step - 1}"
            if source.step
            else f"from_step {from_step} is out of range: run {source.id} has committed no step yet",
            code="step_out_of_range",
        )
    rows = run_transcript_through(run_id=source.id, step=from_step)
    unanswered = _unanswered(rows)
    if unanswered:
        raise Unprocessable(
            f"step {from_step} still waits for the result of tool call(s) {', '.join(unanswered)}; "
            "fork from an earlier step, or once they are answered",
            code="split_tool_pair",
        )
    if source.replays_session:  # what its model saw before its own rows (apps.runs.engine.step._load_rows)
        earlier = replayed_history(tenant_id=source.tenant_id, session_id=source.session_id, turn=source.session_turn)
        return earlier + rows
    return rows


def _unanswered(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The ids of tool_uses in `rows` with no tool_result in `rows`, in order."""
    answered = {b.get("tool_use_id") for _, content in rows for b in content if b.get("type") == "tool_result"}
    used = [str(b["id"]) for _, content in rows for b in content if b.get("type") == "tool_use"]
    return [i for i in used if i not in answered]


def _forked_event(source: Run, from_step: int, rows: int) -> dict[str, Any]:
    return {"type": "forked", "forked": {"run_id": source.id, "step": from_step, "transcript_rows": rows}}
