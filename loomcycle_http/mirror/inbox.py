"""`agents/<name>/inbox/`: a dropped file becomes input to the agent's live interactive run,
or starts one, exactly once, also across a mirror killed at any point (docs/cli.md).

The API has no idempotency key for `POST /v1/runs/{id}/input`, so delivery is a small
durable protocol:

1. Claim: the file is renamed into `inbox/.processing/` (atomic; names starting with `.`
   are never claimed, so write `.x` and rename it into place).
2. Plan: `inbox/.processing/.<file>.json` records, before anything is sent, either
   `start` with an `agent_id` derived from the file (name, mtime, content hash) or `input`
   to a run parked at `awaiting_input` with the run's `last_seq` at that moment.
3. Deliver and settle, re-checked from the API every time the plan is run:
   - `start`: `POST /v1/runs` with that `agent_id`; `409 agent_id_in_use` means an earlier
     attempt already started it.
   - `input`: if a `user_input` event after the recorded seq carries the file's text, it
     was delivered; else if the run is parked at `awaiting_input` it was not (input wakes a
     parked run in the same transaction that queues it), so it is sent; if the run is busy
     the plan waits; if the run ended, the file fails.
4. The file moves to `inbox/.processed/`, or to `inbox/.failed/` with `<file>.reason`.

The one case this cannot tell apart: the same text was also sent to the same run by
someone else after the plan was recorded; the mirror then takes it as its own delivery.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loomcycle_http.client import ApiError, Client, Conflict, ConnectionFailed, NotFound, RateLimited, ServerError
from loomcycle_http.mirror import files

Outcome = Literal["processed", "failed", "wait"]


@dataclass(frozen=True)
class Settled:
    outcome: Outcome
    reason: str = ""


def pending(inbox: Path) -> list[Path]:
    """Files waiting in `inbox`, oldest first (dotfiles and directories are skipped)."""
    if not inbox.is_dir():
        return []
    found = [p for p in inbox.iterdir() if not p.name.startswith(".") and p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def delivery_key(path: Path) -> str:
    """Stable for one dropped file across restarts (rename keeps mtime); new for a new drop."""
    digest = hashlib.sha256(f"{path.name}\0{path.stat().st_mtime_ns}\0".encode())
    digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _unique(target: Path) -> Path:
    n, candidate = 0, target
    while candidate.exists():
        n += 1
        candidate = target.with_name(f"{target.name}.{n}")
    return candidate


class Inbox:
    """Delivers the files of one agent's inbox, one file per pass."""

    def __init__(self, client: Client, agent: str, base: Path) -> None:
        self.client, self.agent = client, agent
        self.inbox = base / "inbox"
        self.processing = self.inbox / ".processing"

    def step(self, runs: list[dict[str, Any]]) -> tuple[str, Settled] | None:
        """Finish a claimed file, else claim and deliver the oldest waiting one. `runs` are
        the agent's runs, newest first. The file settled and how (or still waiting, with a
        reason, after a transient refusal), or None."""
        claimed = pending(self.processing)
        if claimed:
            return self._run(claimed[0])
        self._drop_orphan_plans()
        waiting = pending(self.inbox)
        if not waiting:
            return None
        plan = self._plan_for(runs)
        if plan is None:
            return None  # the interactive run is mid-turn: deliver when it parks
        self.processing.mkdir(parents=True, exist_ok=True)
        path = self.processing / waiting[0].name
        os.rename(waiting[0], path)  # the claim
        plan["key"] = delivery_key(path)
        if plan["kind"] == "start":
            plan["agent_id"] = f"a_{plan['key']}"
        files.write_json_atomic(self._plan_path(path), plan)
        return self._run(path)

    def _plan_for(self, runs: list[dict[str, Any]]) -> dict[str, Any] | None:
        live = [r for r in runs if r.get("interactive") and r.get("live")]
        if not live:  # the pass saw the tenant's newest 1000 runs: ask for this agent's live ones by name
            live = [r for r in self.client.runs.list(status="running", agent=self.agent) if r.get("interactive")]
        if not live:
            return {"kind": "start"}
        if live[0]["state"] != "awaiting_input":
            return None
        return {"kind": "input", "run_id": live[0]["run_id"], "after_seq": int(live[0]["last_seq"])}

    def _plan_path(self, path: Path) -> Path:
        return self.processing / f".{path.name}.json"

    def _drop_orphan_plans(self) -> None:
        """Plans whose file was already moved out (a crash between the move and the cleanup)."""
        for plan in self.processing.glob(".*.json") if self.processing.is_dir() else []:
            if not (self.processing / plan.name[1:-5]).exists():
                plan.unlink()

    def _run(self, path: Path) -> tuple[str, Settled] | None:
        plan_path = self._plan_path(path)
        if not plan_path.exists():  # claimed, then killed before the plan: nothing was sent
            os.rename(path, _unique(self.inbox / path.name))
            return None
        plan = json.loads(plan_path.read_text(encoding="utf-8"))
        settled = self._settle(path, plan)
        if settled.outcome == "wait":
            return (path.name, settled) if settled.reason else None
        if settled.outcome == "failed":
            failed = self.inbox / ".failed"
            failed.mkdir(exist_ok=True)
            target = _unique(failed / path.name)
            files.write_atomic(target.with_name(target.name + ".reason"), settled.reason + "\n")
        else:
            (self.inbox / ".processed").mkdir(exist_ok=True)
            target = _unique(self.inbox / ".processed" / path.name)
        os.rename(path, target)
        plan_path.unlink()
        return path.name, settled

    def _settle(self, path: Path, plan: dict[str, Any]) -> Settled:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            return Settled("failed", "invalid_file: the file is not UTF-8 text")
        if not text.strip():
            return Settled("failed", "empty_input: the file is empty")
        try:
            if plan["kind"] == "start":
                return self._start(plan, text)
            return self._input(plan, text, path)
        except ConnectionFailed as exc:
            return Settled("wait", f"unreachable: {exc.message}")
        except (RateLimited, ServerError) as exc:  # while checking the run: transient
            return Settled("wait", f"{exc.code}: {exc.message}")

    def _start(self, plan: dict[str, Any], text: str) -> Settled:
        try:
            self.client.runs.create(self.agent, text, agent_id=plan["agent_id"], interactive=True)
        except Conflict as exc:
            if exc.code == "agent_id_in_use":
                return Settled("processed")  # an earlier attempt started it
            return Settled("failed", f"{exc.code}: {exc.message}")
        except (RateLimited, ServerError) as exc:
            return Settled("wait", f"{exc.code}: {exc.message}")
        except ApiError as exc:
            return Settled("failed", f"{exc.code}: {exc.message}")
        return Settled("processed")

    def _input(self, plan: dict[str, Any], text: str, path: Path) -> Settled:
        run_id = str(plan["run_id"])
        try:
            run = self.client.runs.get(run_id)
            if self._landed(run_id, int(plan["after_seq"]), text):
                return Settled("processed")
        except NotFound as exc:
            return Settled("failed", f"{exc.code}: {exc.message}")
        if not run.get("live"):
            return Settled("failed", f"run_ended: run {run_id} ended ({run['state']}) before the input was delivered")
        if run["state"] != "awaiting_input":
            return Settled("wait")
        files.write_json_atomic(self._plan_path(path), {**plan, "after_seq": int(run["last_seq"])})
        try:
            self.client.runs.input(run_id, text)
        except (RateLimited, ServerError) as exc:
            return Settled("wait", f"{exc.code}: {exc.message}")
        except ApiError as exc:
            return Settled("failed", f"{exc.code}: {exc.message}")
        return Settled("processed")

    def _landed(self, run_id: str, after_seq: int, text: str) -> bool:
        """Whether a steering `user_input` after `after_seq` carries `text`."""
        for row in self.client.runs.event_rows(run_id, from_seq=after_seq):
            if row["type"] != "user_input":
                continue
            segments = [str(s.get("text", "")) for s in (row.get("payload") or {}).get("segments") or []]
            if text.strip() in {s.strip() for s in segments} or "\n\n".join(segments).strip() == text.strip():
                return True
        return False
