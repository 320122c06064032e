"""Runs → files: `agents/<name>/status`, `agents/<name>/runs/<run_id>/{status,
events.ndjson,transcript.ndjson}` and `agents/<name>/logs/<date>.ndjson` (docs/cli.md).

Invariants:
- Each ndjson file resumes from its own last `seq` (per run in a log file), so a restart,
  even after SIGKILL, neither repeats nor skips a line; the API is the source of truth.
- `events.ndjson` is appended last and `status` written after it: a run whose status
  file is current has every event on disk.
- A run's files or a log file deleted under a running mirror are written again on its next pass.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from loomcycle_http.client import Client, Forbidden, NotFound
from loomcycle_http.mirror import files

TRANSCRIPT_TYPES = frozenset({"user_input", "text", "thinking", "tool_call", "tool_result"})


AGENT_NAME_RE = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")  # the API's agent names ("/"-separated)
RUN_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def agent_dir(root: Path, agent: str) -> Path:
    """`root/agents/<agent>`; a name the API would never give (`..`, absolute) is refused."""
    if not AGENT_NAME_RE.fullmatch(agent):
        raise ValueError(f"not an agent name: {agent!r}")
    return root / "agents" / agent


def placeable(row: dict[str, Any]) -> bool:
    """Whether a listed run's names are safe as paths under DIR."""
    return bool(AGENT_NAME_RE.fullmatch(str(row.get("agent")))) and bool(RUN_ID_RE.fullmatch(str(row.get("run_id"))))


def transcript_line(row: dict[str, Any]) -> dict[str, Any] | None:
    """One conversation line of a stored event (None for events that are not conversation)."""
    payload, seq = row.get("payload") or {}, row["seq"]
    kind = row["type"]
    if kind == "user_input":
        texts = [str(s.get("text", "")) for s in payload.get("segments") or [] if s.get("role", "user") == "user"]
        return {"seq": seq, "role": "user", "text": "\n\n".join(texts), "source": payload.get("source") or "initial"}
    if kind in ("text", "thinking"):
        return {"seq": seq, "role": "assistant" if kind == "text" else "thinking", "text": payload.get("text", "")}
    use = payload.get("tool_use") or {}
    if kind == "tool_call":
        return {
            "seq": seq,
            "role": "tool_call",
            "id": use.get("id"),
            "name": use.get("name"),
            "input": use.get("input"),
        }
    if kind == "tool_result":
        line = {"seq": seq, "role": "tool_result", "id": use.get("id"), "name": use.get("name")}
        return {**line, "text": payload.get("text", ""), "is_error": bool(payload.get("is_error"))}
    return None


def log_line(run_id: str, row: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": run_id, **row}


class RunMirror:
    """Writes the files of every run the caller's tenant can list."""

    def __init__(self, client: Client, root: Path) -> None:
        self.client, self.root = client, root
        self._seen: dict[str, tuple[int, str]] = {}  # run_id → (last_seq, state) already on disk
        self._logged: dict[Path, dict[str, int]] = {}  # log file → run_id → last seq in it

    def sync(self) -> list[dict[str, Any]]:
        """One pass: every run's files, then every agent's status; the runs listed (newest first)."""
        rows = [row for row in self.client.runs.list(status="all") if placeable(row)]
        by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for name in self._agent_names():
            by_agent[name] = []
        for row in rows:
            by_agent[str(row["agent"])].append(row)
            self._sync_run(row)
        for name, runs in by_agent.items():
            self._write_agent_status(name, runs)
        return rows

    def _agent_names(self) -> list[str]:
        """The agents the caller may define (none when the token lacks substrate:tenant)."""
        try:
            return [name for row in self.client.agents.list() if AGENT_NAME_RE.fullmatch(name := str(row["name"]))]
        except Forbidden:
            return []

    def _write_agent_status(self, name: str, runs: list[dict[str, Any]]) -> None:
        base = agent_dir(self.root, name)
        (base / "inbox").mkdir(parents=True, exist_ok=True)
        latest = runs[0] if runs else None
        status = {
            "agent": name,
            "runs": len(runs),
            "live_runs": [r["run_id"] for r in runs if r.get("live")],
            "latest_run": {"run_id": latest["run_id"], "state": latest["state"]} if latest else None,
        }
        files.write_json_atomic(base / "status", status)

    def _sync_run(self, row: dict[str, Any]) -> None:
        run_id, key = str(row["run_id"]), (int(row.get("last_seq") or 0), str(row["state"]))
        run_dir = agent_dir(self.root, str(row["agent"])) / "runs" / run_id
        if self._seen.get(run_id) == key and self._on_disk(run_dir, key[0]):
            return
        events_path = run_dir / "events.ndjson"
        from_seq = files.last_seq(events_path)
        if from_seq < key[0]:
            try:
                new = list(self.client.runs.event_rows(run_id, from_seq=from_seq))
            except NotFound:  # erased between the list and the read
                return
            self._append(run_dir, str(row["agent"]), run_id, new)
        files.write_json_atomic(run_dir / "status", row)
        self._seen[run_id] = key

    @staticmethod
    def _on_disk(run_dir: Path, last: int) -> bool:
        """Whether the run's files are still there (nobody deleted them under the mirror)."""
        names = ("status", "events.ndjson", "transcript.ndjson") if last else ("status",)
        return all((run_dir / name).exists() for name in names)

    def _append(self, run_dir: Path, agent: str, run_id: str, rows: list[dict[str, Any]]) -> None:
        """Logs, then the transcript, then events: each skips the seqs it already holds."""
        by_day: dict[Path, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            date = str(row.get("created_at", ""))[:10]
            path = agent_dir(self.root, agent) / "logs" / f"{date if DATE_RE.fullmatch(date) else 'undated'}.ndjson"
            if row["seq"] > self._logged_seq(path, run_id):
                by_day[path].append(row)
        for path, day in by_day.items():
            files.append_lines(path, (files.dumps_line(log_line(run_id, r)) for r in day))
            self._logged[path][run_id] = int(day[-1]["seq"])
        transcript = run_dir / "transcript.ndjson"
        run_dir.mkdir(parents=True, exist_ok=True)
        transcript.touch()  # present even before the first conversation line
        after = files.last_seq(transcript)
        lines = [t for r in rows if r["seq"] > after and (t := transcript_line(r)) is not None]
        files.append_lines(transcript, (files.dumps_line(t) for t in lines))
        events = run_dir / "events.ndjson"
        after = files.last_seq(events)
        files.append_lines(events, (files.dumps_line(r) for r in rows if r["seq"] > after))

    def _logged_seq(self, path: Path, run_id: str) -> int:
        if path not in self._logged or not path.exists():  # first use, or deleted under the mirror
            index: dict[str, int] = {}
            for line in files.read_lines(path):
                index[line["run_id"]] = max(index.get(line["run_id"], 0), int(line["seq"]))
            self._logged[path] = index
        return self._logged[path].get(run_id, 0)
