"""A tool-calling iteration writes twice: the claim and the step commit, which records the
step's tool calls (issue 43: no write of its own before the tools run). The records are there
once the step is, finished or (for a parked call) started, in the model's order, with the time
the batch began; a call that parks is answered through its record as before; the Interruption
tool counts a turn's parallel asks from the batch it is given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.runs import engine
from apps.runs.engine import toolrun
from apps.runs.engine import tools as tool_phase
from apps.runs.interrupts import services as interrupts
from apps.runs.models import Interrupt, Run, RunStatus, ToolCallRecord
from apps.runs.store import hot
from tests.factories.runs import ASK, ask_run

pytestmark = pytest.mark.usefixtures("agents")


def test_the_step_commit_records_the_batch_and_nothing_is_written_before_the_tools(
    no_workers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {"hot": 0}
    real_hot, real_calls = hot._hot, toolrun.run_calls

    def counted_hot(sql: str, params: Any, **kw: Any) -> Any:
        seen["hot"] += 1
        return real_hot(sql, params, **kw)

    def probed_calls(base: Any, calls: Any) -> Any:
        seen["records_while_tools_run"] = ToolCallRecord.objects.filter(run_id=base.run_id).count()
        seen["batch"] = [(call_id, name) for call_id, name, _ in base.batch]
        return real_calls(base, calls)

    monkeypatch.setattr(hot, "_hot", counted_hot)
    monkeypatch.setattr(tool_phase, "run_calls", probed_calls)
    other = {"op": "ask", "question": "And staging?", "options": ["yes", "no"]}
    run = ask_run("asker-one", tools=[{"tool": "Interruption", "input": ASK}, {"tool": "Interruption", "input": other}])
    engine.run_iterate(run_id=run.id, step=0)

    assert seen["hot"] == 2  # the claim and the step commit: no tool-start write between them
    assert seen["records_while_tools_run"] == 0
    first, second = (call_id for call_id, _ in seen["batch"])
    assert seen["batch"] == [(first, "Interruption"), (second, "Interruption")]
    records = list(ToolCallRecord.objects.filter(run_id=run.id).order_by("id"))
    # max_pending 1: the first ask parks (its record started), the second is refused in the model's order
    assert [(r.call_id, r.status, r.is_error, r.step) for r in records] == [
        (first, "started", False, 0),
        (second, "finished", True, 0),
    ]
    assert records[0].input == ASK and records[0].finished_at is None
    finished_at = records[1].finished_at
    assert (
        finished_at is not None and records[1].started_at == records[0].started_at <= finished_at
    )  # the batch's start
    assert Run.objects.get(id=run.id).status == RunStatus.AWAITING_INTERRUPT

    row = Interrupt.objects.get(run_id=run.id)  # the answer finds the parked call through its record
    interrupts.interrupt_resolve(
        tenant_id=None, owner=None, run_id=run.id, interrupt_id=row.id, reply=interrupts.Resolve(answer="yes")
    )
    answered = ToolCallRecord.objects.get(id=records[0].id)
    assert answered.status == "finished" and not answered.is_error and answered.finished_at is not None
    result = json.loads(
        next(
            e.payload["text"]
            for e in run.events.filter(type="tool_result").order_by("seq")
            if e.payload["tool_use"]["id"] == first
        )
    )
    assert result["answer"] == "yes"
