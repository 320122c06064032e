"""A scripted run of the snapshot tests."""

from __future__ import annotations

import json
from typing import Any

from apps.runs import services
from apps.runs.models import Run
from apps.runs.prompt import Segment
from tests.conftest import ALICE

SUBSCRIBE = {"op": "subscribe", "channel": "handoff", "wait_ms": 110_000, "max_messages": 1}


def scripted(steps: list[dict[str, Any]], **kw: Any) -> Run:
    prompt = f"Move me. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ALICE, data=data)
