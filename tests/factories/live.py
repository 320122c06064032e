"""Helpers of the live-text tests (tests/runs/test_live_tokens.py, tests/cli/test_live_text.py):
a chunked mock-script reply, the mock's send times, and the client's text by docs/api.md's rule."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from apps.core.redis import sync_client
from apps.gateway.providers.mock_chunks import sent_key
from apps.runs.models import RunEvent

WORDS = 40
REPLY = " ".join(f"word{i:02d}" for i in range(WORDS))


def script(text: str = REPLY, chunk_chars: int = 3, chunk_ms: int = 40, **step: Any) -> str:
    return "MOCK_SCRIPT: " + json.dumps([{"text": text, "chunk_chars": chunk_chars, "chunk_ms": chunk_ms, **step}])


VOIDS = ("retry", "provider_fallback", "turn_cancelled")  # an id-less one voids the unconfirmed live text


def client_text(frames: list[dict[str, Any]], kind: str = "text") -> str:
    """What a client following docs/api.md shows: `kind` frames joined; an id-less `retry`,
    `provider_fallback` or `turn_cancelled` drops the id-less frames since the last one with an id."""
    confirmed, pending = "", ""
    for f in frames:
        if f["event"] == kind:
            if f.get("id") is None:
                pending += f["data"]["text"]
            else:
                confirmed, pending = confirmed + pending + f["data"]["text"], ""
        elif f["event"] in VOIDS and f.get("id") is None:
            pending = ""
    return confirmed + pending


def committed_text(run_id: str, kind: str = "text") -> str:
    rows = RunEvent.objects.filter(run_id=run_id, type=kind).order_by("seq")
    return "".join(str(r.payload["text"]) for r in rows)


def sent_times(run_id: str, kind: str = "text") -> list[float]:
    """The mock's send time of each piece of the run's reply (or thinking) (unix time)."""
    entries = [v.split() for v in sync_client().lrange(sent_key(run_id, kind), 0, -1)]
    return [float(at) for at, chars in entries if int(chars) > 0]


def read_sse(resp: httpx.Response, until: Any = None) -> list[dict[str, Any]]:
    """SSE frames with their arrival time (`at`, unix time); stops when `until(frames)` holds."""
    frames: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    for line in resp.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            key, _, value = line.partition(": ")
            cur[key] = int(value) if key == "id" else json.loads(value) if key == "data" else value
            continue
        if cur:
            frames.append({**cur, "at": time.time()})
            cur = {}
            if until is not None and until(frames):
                break
    return frames


def live_frames(frames: list[dict[str, Any]], kind: str = "text") -> list[dict[str, Any]]:
    return [f for f in frames if f["event"] == kind and f.get("id") is None]
