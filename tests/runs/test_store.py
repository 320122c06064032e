"""Run creation in plain SQL (`apps.runs.store.insert_run`, the substrate's
`def_resolve`): what it writes is what the ORM reads back, field for field."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from apps.core.errors import Conflict
from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment
from apps.substrate.models import AgentDef
from apps.substrate.selectors import agent_def_resolve
from tests.conftest import ALICE

pytestmark = pytest.mark.usefixtures("agents")


def _fields(run: Run) -> dict[str, Any]:
    return {f.attname: getattr(run, f.attname) for f in Run._meta.concrete_fields}


def test_a_created_run_reads_back_as_the_instance_returned() -> None:
    data = services.RunCreate(
        agent="toolcaller",
        segments=[Segment(role="system", text="be brief"), Segment(text="hello")],
        user_id="u1",
        metadata={"k": "v"},
        max_iterations=5,
    )
    with transaction.atomic():  # read back before the doorbell rings: no worker of another test claims it first
        run = services.run_create(principal=ALICE, data=data)
        assert not run._state.adding
        stored = Run.objects.get(id=run.id)
        entries = list(TranscriptEntry.objects.filter(run_id=run.id))
        events = list(RunEvent.objects.filter(run_id=run.id).order_by("seq"))
    assert _fields(stored) == _fields(run)
    assert stored.status == RunStatus.QUEUED and stored.step == 0 and stored.max_iterations == 5
    assert stored.metadata == {"k": "v"} and stored.last_seq == 2 and stored.transcript_len == 1
    [entry] = entries
    assert (entry.idx, entry.step, entry.role, entry.content) == (0, 0, "user", [{"type": "text", "text": "hello"}])
    assert [(e.seq, e.type, e.payload["type"]) for e in events] == [
        (1, "user_input", "user_input"),
        (2, "system_prompt", "system_prompt"),
    ]
    assert events[0].created_at == entry.created_at == stored.created_at


def test_a_duplicate_agent_id_is_a_conflict_and_leaves_a_callers_transaction_usable() -> None:
    data = services.RunCreate(agent="toolcaller", segments=[Segment(text="x")], agent_id="a_fixed_handle")
    services.run_create(principal=ALICE, data=data)
    with pytest.raises(Conflict):
        services.run_create(principal=ALICE, data=data)
    with transaction.atomic():
        with pytest.raises(Conflict):
            services.run_create(principal=ALICE, data=data)
        assert Run.objects.filter(agent_id="a_fixed_handle").count() == 1  # the savepoint rolled back alone


def test_the_resolved_agent_is_the_orm_row() -> None:
    found = agent_def_resolve(tenant_id="", name="toolcaller")
    assert found == AgentDef.objects.get(id=found.id)
    assert {f.attname: getattr(found, f.attname) for f in AgentDef._meta.concrete_fields} == {
        f.attname: getattr(AgentDef.objects.get(id=found.id), f.attname) for f in AgentDef._meta.concrete_fields
    }


def test_the_statuses_a_step_commit_parks_in_are_the_models_parks_but_the_creation_waits() -> None:
    from apps.runs.models import PARKED, RunStatus
    from apps.runs.store import PARKED_STATUSES

    created_waiting = {RunStatus.WAITING_SLOT.value, RunStatus.WAITING_SESSION.value}  # only run creation sets them
    assert set(PARKED_STATUSES) == {s.value for s in PARKED} - created_waiting
