"""The session tests' shapes: a scripted run's body, and a session whose first run answered."""

from __future__ import annotations

import json
from typing import Any

import httpx

from apps.runs.models import RunStatus
from tests.conftest import wait_status


def body(text: str, steps: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"prompt": f"{text} MOCK_SCRIPT: {json.dumps(steps)}", **kw}


def new_session(http: httpx.Client, headers: dict[str, str] | None = None) -> str:
    """A session whose first run answered `first answer`; its id."""
    resp = http.post(
        "/v1/runs",
        headers=headers,
        json={"agent": "scripted", **body("P0", [{"text": "first answer"}], background=True)},
    )
    assert resp.status_code == 202, resp.text
    wait_status(resp.json()["run_id"], RunStatus.COMPLETED, timeout=30)
    return str(resp.json()["session_id"])
