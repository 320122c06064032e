"""The sync wait without Redis: the run was committed before the wait began,
so the wait goes on by its 1 s re-reads and still answers (never a 500)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apps.runs import services
from apps.runs.prompt import Segment
from apps.triggers.webhooks.waits import run_terminal_status
from tests.conftest import ALICE
from tests.procs import WorkerPool


@pytest.mark.usefixtures("agents")
def test_a_sync_wait_with_redis_unreachable_still_answers(stack: WorkerPool, settings: Any) -> None:
    run = services.run_create(principal=ALICE, data=services.RunCreate(agent="echo", segments=[Segment(text="hi")]))
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: subscribe fails
    status = asyncio.run(run_terminal_status(run.id, 20))
    assert status == "completed"
