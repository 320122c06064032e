"""The world tools' test shapes: a ToolContext over volumes, ok/err results, scripted tool runs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from apps.core.tools import ToolContext, ToolResult, VolumeBinding
from apps.runs import services
from apps.runs.models import Run, RunEvent
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_for


def ctx_for(*bindings: VolumeBinding) -> ToolContext:
    return ToolContext(
        run_id="r_test",
        agent_id="a_test",
        session_id="s_test",
        tenant_id="",
        user_id="",
        agent_name="files",
        agent_def_id="d",
        agent_def_sha256="",
        provider="mock",
        model="mock-script",
        step=0,
        call_id="c1",
        tools=("Read", "Write", "Edit", "Glob", "Grep"),
        volumes=bindings,
        cancelled=threading.Event(),
    )


def err(result: ToolResult) -> str:
    assert result.is_error, result.text
    return result.text


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.text
    return result.text


def alive(pid: int) -> bool:
    """Running (a killed orphan may stay a zombie until init reaps it: that is not alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone(pid: int) -> None:
    """SIGKILL is delivered when the process is next scheduled: wait (bounded) for it to land."""
    wait_for(lambda: not alive(pid), timeout=2)


STATIC = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "volumes-static"


def scripted(agent: str, steps: list[dict[str, Any]], **kw: Any) -> Run:
    prompt = f"MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ALICE, data=data)


def results(run_id: str) -> list[tuple[str, str, bool]]:
    rows = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return [(e.payload["tool_use"]["name"], e.payload["text"], e.payload["is_error"]) for e in rows]
