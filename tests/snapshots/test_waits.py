"""A restored channel wait is checked against the restored messages: a message
the snapshot carries that its parked subscriber never saw still answers it
(apps.channels.snapshot), with the suite's workers and beat."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from apps.core.ids import new_agent_id, new_run_id
from apps.runs import services
from apps.runs.models import RunEvent, RunStatus
from apps.snapshots import services as snapshots
from apps.snapshots.envelope import canonical, checksum_of
from tests.conftest import ALICE, wait_status
from tests.factories.snapshots import SUBSCRIBE, scripted
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def _as_another_run(envelope: dict[str, Any], run_id: str) -> tuple[dict[str, Any], str]:
    """The envelope with run `run_id` (and its wait) renamed, plus a handoff message
    published after its wait: what a snapshot holds when a publish raced the pause."""
    moved = copy.deepcopy(envelope)
    sections = moved["sections"]
    new_id = new_run_id()
    (entry,) = [e for e in sections["paused_runs"]["rows"] if e["run"]["id"] == run_id]
    entry["run"].update(id=new_id, agent_id=new_agent_id())
    (wait,) = sections["channels"]["rows"]["waits"]
    wait["run_id"] = new_id
    message = {
        "id": "msg_0000000000000001deadbeef",
        "tenant_id": "",
        "channel": "handoff",
        "scope": "global",
        "scope_id": "",
        "payload": "raced the pause",
        "published_at": wait["created_at"],
        "visible_at": wait["created_at"],
        "expires_at": None,
        "published_by": "_test",
        "published_by_user_id": "",
        "idempotency_key": "",
    }
    sections["channels"]["rows"]["messages"].append(message)
    moved["checksum"] = checksum_of(canonical(sections))
    return moved, new_id


def test_a_restored_wait_is_answered_by_a_restored_message(stack: WorkerPool) -> None:
    waiting = scripted([{"tool": "Channel", "input": SUBSCRIBE}, {"echo": True}])
    wait_status(waiting.id, RunStatus.WAITING_CHANNEL, timeout=30)
    assert asyncio.run(services.runtime_pause(timeout_ms=30_000))["state"] == "paused"
    try:
        envelope = json.loads(snapshots.snapshot_capture(label="race").content)
        services.run_cancel(principal=ALICE, agent_id=waiting.agent_id, reason="its copy is restored")
        moved, new_id = _as_another_run(envelope, waiting.id)
        counts = snapshots.snapshot_restore(envelope=moved)
        assert (counts["paused_runs_restored"], counts["channel_waits_restored"]) == (1, 1)
        assert counts["channel_messages_restored"] == 1
    finally:
        services.runtime_resume()
    wait_status(new_id, RunStatus.COMPLETED, timeout=30)  # no publish here: beat's wake tick found the message
    (answer,) = RunEvent.objects.filter(run_id=new_id, type="tool_result").values_list("payload", flat=True)
    assert "raced the pause" in json.dumps(answer)
