"""Ended run trees in bulk for the lifecycle tests: clones of one real run (made and finished
by the engine in this process), with their events, transcript and ledger rows."""

from __future__ import annotations

import secrets
from datetime import datetime

from apps.core.types import Principal
from apps.gateway.models import UsageEntry
from apps.runs import services
from apps.runs.models import TERMINAL, Run, RunEvent, TranscriptEntry
from apps.runs.prompt import Segment
from tests.factories.runs import drive


def finished_run(principal: Principal, *, prompt: str = "hi", user_id: str = "", agent: str = "echo") -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], user_id=user_id)
    run = services.run_create(principal=principal, data=data)
    run = drive(run.id)
    assert run.status in TERMINAL
    return run


def clones(template: Run, n: int, *, ended_at: datetime, tenant_id: str | None = None, agent: str = "") -> list[str]:
    """`n` ended top-level copies of `template` (events, transcript, a ledger row each); their ids."""
    events = list(RunEvent.objects.filter(run_id=template.id))
    entries = list(TranscriptEntry.objects.filter(run_id=template.id))
    runs, ids = [], []
    for _ in range(n):
        run = Run.objects.get(id=template.id)
        run.id = f"r_{secrets.token_hex(8)}"
        run.agent_id, run.session_id = f"a_{secrets.token_hex(8)}", f"s_{secrets.token_hex(8)}"
        run.tenant_id = template.tenant_id if tenant_id is None else tenant_id
        run.agent_name = agent or template.agent_name
        run.completed_at = ended_at
        runs.append(run)
        ids.append(run.id)
    Run.objects.bulk_create(runs)
    RunEvent.objects.bulk_create(
        RunEvent(run_id=i, seq=e.seq, step=e.step, type=e.type, payload=e.payload) for i in ids for e in events
    )
    TranscriptEntry.objects.bulk_create(
        TranscriptEntry(run_id=i, idx=t.idx, step=t.step, role=t.role, content=t.content) for i in ids for t in entries
    )
    UsageEntry.objects.bulk_create(
        UsageEntry(
            created_at=ended_at,
            tenant_id=tenant_id or "",
            run_id=i,
            source="run",
            provider="mock",
            model="m",
            input_tokens=7,
        )
        for i in ids
    )
    return ids
