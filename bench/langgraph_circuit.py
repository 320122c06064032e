#!/usr/bin/env python
"""LangGraph peer of the circuit bench (bench/circuit.py), measured in the same run.

loomcycle's three-agent circuit (SPEC 7.5) built the idiomatic LangGraph way. Per
circuit cN, three runs start at the same moment:

- researcher: Memory set `cN-research`, Channel publish `research-done/cN`, "done";
- editor: Channel subscribe `research-done/cN` (waits), Memory get the research,
  Memory set `cN-research-edited`, Context self, Channel publish `editing-done/cN`
  with its run id (`editor_run_id`), "done";
- evaluator: Channel subscribe `editing-done/cN` (waits), Memory get both, Memory
  set `cN-research-scored`, Evaluation submit for the editor's run, "done".

Each run is a LangGraph thread of a ReAct graph (model node + ToolNode, routed by
`tools_condition`). The model is a deterministic fake `BaseChatModel` with zero
latency that plays the same per-step scripts as our mock provider
(apps/gateway/providers/mock.py): the step is the number of tool results so far;
each step returns its narration text plus one tool call; after the last step it
answers "done".

Storage is Postgres, all through one psycopg `AsyncConnectionPool`:
- checkpoints: `AsyncPostgresSaver`, with durability "sync" by default (each
  super-step is committed before the next one starts, like our per-iteration
  commit). Threads are spread over 8 savers on the one pool (see SAVERS);
- Memory (user scope): LangGraph's `AsyncPostgresStore`, namespace ("user", <user>);
- Channel: table `lg_channel_messages` plus one committed cursor per channel
  (`lg_channel_cursors`), read and advanced in one transaction, as our subscribe does;
- Evaluation: an INSERT into `lg_evaluations`, after checking that the evaluated
  run (thread) exists.

Waiting, without a busy loop and without holding a coroutine: a subscribe that
finds no message calls `interrupt()`. The graph stops, its checkpoint is saved
and the driving task ends: the thread is parked. The driver then records the
thread in `lg_waiters` and re-checks the channel. A publisher INSERTs its
message and then DELETEs the channel's waiters it finds. Both sides write
first and read second, each in its own committed statement, so at least one of
them sees the other. Whoever deletes the waiter row resumes the thread, with
`Command(resume=...)` in a new task, so a thread is resumed exactly once. The
resumed ToolNode runs the subscribe again, which now reads the message.

Everything runs on asyncio in ONE process, on one core. Our runtime spreads over
Celery worker processes.

Usage (needs the peer venv: `python3 -m venv .venv-peer &&
.venv-peer/bin/pip install -r requirements/bench-peer.txt`):

    .venv-peer/bin/python bench/langgraph_circuit.py --dsn postgresql://... [--levels 10,100,500]

The bench creates and uses its own database (`--database`, default `lgpeer`) on
the DSN's server. Before each level it drops and recreates its tables. It ends
with one machine-readable line `lg_circuits_per_s_10=... lg_p99_ms_500=...`.
`run_levels(dsn, levels)` returns the same figures as a dict. If it is called
from an interpreter without LangGraph (our .venv), it re-runs this file under
.venv-peer/bin/python.
"""

# No `from __future__ import annotations`: langchain's @tool reads the tools' annotations at
# run time, and ToolRuntime is imported inside build_graphs. The LangGraph imports are all
# local so this module also imports in our .venv, where run_levels re-runs it in .venv-peer.
import argparse
import asyncio
import contextvars
import importlib.util
import json
import math
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
DEFAULT_LEVELS = [10, 100, 500]
DEFAULT_DATABASE = "lgpeer"
POOL_MAX = 20
# AsyncPostgresSaver wraps every statement it runs in one asyncio.Lock of its own, even
# on a pool, so a single saver runs one checkpoint statement at a time in the whole
# process. At 500 circuits the lock queue halved throughput (4.3 vs 8.3 circuits/s).
# Threads are spread over SAVERS savers on the same pool and tables: same semantics,
# without the process-wide serialisation (--savers 1 gives the single-saver set-up).
SAVERS = 8
POOL_WAIT_S = 600.0
LEVEL_TIMEOUT_S = 900.0
WARMUP_CIRCUITS = 5
USER_ID = "bench-user"
NAMESPACE = ("user", USER_ID)
ROLES = ("researcher", "editor", "evaluator")
SUBSCRIBE_WAIT_MS = 120_000
MAX_MESSAGES_CAP = 100
RESULT_LINE_PREFIX = "lg_circuits_per_s_"


# --- the scripted roles (same scripts as our mock-researcher/-editor/-evaluator) ---

Step = tuple[str, str, dict[str, Any]]  # (narration, tool name, tool input)
_CIRCUIT_ID = re.compile(r"\bc\d+\b", re.ASCII)


def circuit_id(text: str) -> str:
    found = _CIRCUIT_ID.search(text)
    return found.group(0) if found else "c0"


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def derive_score(seed: str) -> float:
    return 0.85 if not seed else 0.50 + (fnv1a32(seed.encode()) % 50) / 100.0


def _object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) and value else ""


def find_key(result: str, key: str) -> str:
    """A non-empty string `key` in one tool result: at the top level, in a
    `messages[]` entry or its `value`, else by a raw regex over the text."""
    doc = _object(result)
    if doc is not None:
        if hit := _text(doc.get(key)):
            return hit
        entries = doc.get("messages")
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            inner = _object(entry.get("value")) or {}
            if hit := _text(entry.get(key)) or _text(inner.get(key)):
                return hit
    raw = re.search(r'"' + re.escape(key) + r'"\s*:\s*"([^"]+)"', result)
    return raw.group(1) if raw else ""


def newest(results: list[str], key: str) -> str:
    return next((hit for result in reversed(results) if (hit := find_key(result, key))), "")


def _set(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "op": "set", "scope": "user", "value": value}


def _get(key: str) -> dict[str, Any]:
    return {"key": key, "op": "get", "scope": "user"}


def _subscribe(channel: str) -> dict[str, Any]:
    return {"channel": channel, "max_messages": 1, "op": "subscribe", "wait_ms": SUBSCRIBE_WAIT_MS}


def _publish(channel: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"channel": channel, "op": "publish", "value": value}


def researcher_script(cid: str, results: list[str]) -> list[Step]:
    research = {"text": f"Mock research for {cid}: a brief factual answer."}
    return [
        ("storing research", "Memory", _set(f"{cid}-research", research)),
        ("publishing done signal", "Channel", _publish(f"research-done/{cid}", {"circuit_id": cid})),
    ]


def editor_script(cid: str, results: list[str]) -> list[Step]:
    run_id = newest(results, "run_id") or f"mock-editor-{cid}"
    return [
        ("subscribing to research-done", "Channel", _subscribe(f"research-done/{cid}")),
        ("reading research", "Memory", _get(f"{cid}-research")),
        ("storing edited version", "Memory", _set(f"{cid}-research-edited", {"text": f"Mock edit {cid}: tightened."})),
        ("fetching self identity", "Context", {"op": "self"}),
        (
            "publishing editing-done",
            "Channel",
            _publish(f"editing-done/{cid}", {"circuit_id": cid, "editor_run_id": run_id}),
        ),
    ]


def evaluator_script(cid: str, results: list[str]) -> list[Step]:
    editor_run_id = newest(results, "editor_run_id")
    score = derive_score(editor_run_id + cid)
    return [
        ("subscribing to editing-done", "Channel", _subscribe(f"editing-done/{cid}")),
        ("reading research", "Memory", _get(f"{cid}-research")),
        ("reading edited version", "Memory", _get(f"{cid}-research-edited")),
        ("storing score", "Memory", _set(f"{cid}-research-scored", {"rationale": "ok", "score": score})),
        (
            "submitting evaluation",
            "Evaluation",
            {"op": "submit", "rationale": "ok", "run_id": editor_run_id, "score": score},
        ),
    ]


SCRIPTS: dict[str, Callable[[str, list[str]], list[Step]]] = {
    "researcher": researcher_script,
    "editor": editor_script,
    "evaluator": evaluator_script,
}


def script_step(role: str, cid: str, results: list[str]) -> Step | None:
    """The step to play after `len(results)` tool results; None once the script is over."""
    steps = SCRIPTS[role](cid, results)
    return steps[len(results)] if len(results) < len(steps) else None


def circuit_prompt(cid: str) -> str:
    return f"Your circuit_id is {cid}. Question: what is known about topic {cid}?"


# --- Postgres ------------------------------------------------------------------

LANGGRAPH_TABLES = (
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "checkpoint_migrations",
    "store",
    "store_migrations",
    "store_vectors",
    "vector_migrations",
)
PEER_TABLES = ("lg_channel_messages", "lg_channel_cursors", "lg_waiters", "lg_evaluations")
PEER_DDL = (
    """CREATE TABLE lg_channel_messages (
        id bigserial PRIMARY KEY,
        channel text NOT NULL,
        value jsonb NOT NULL,
        published_by text NOT NULL,
        published_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX lg_channel_messages_channel ON lg_channel_messages (channel, id)",
    "CREATE TABLE lg_channel_cursors (channel text PRIMARY KEY, cursor bigint NOT NULL DEFAULT 0)",
    """CREATE TABLE lg_waiters (
        thread_id text PRIMARY KEY,
        channel text NOT NULL,
        role text NOT NULL,
        circuit_id text NOT NULL,
        parked_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX lg_waiters_channel ON lg_waiters (channel)",
    """CREATE TABLE lg_evaluations (
        id bigserial PRIMARY KEY,
        run_id text NOT NULL,
        score double precision NOT NULL,
        rationale text NOT NULL,
        evaluator_run_id text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())""",
)


def ensure_database(dsn: str, database: str) -> str:
    """The conninfo of `database` on the DSN's server, created if missing ('' = the DSN's own)."""
    if not database:
        return dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return make_conninfo(dsn, dbname=database)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


# --- one level's bookkeeping -----------------------------------------------------


@dataclass
class Level:
    circuits: int
    started: float = 0.0
    runs_left: int = 0
    threads: dict[str, dict[str, str]] = field(default_factory=dict)  # cid -> role -> thread id
    circuit_done: dict[str, float] = field(default_factory=dict)  # cid -> evaluator finish
    last_run_done: float = 0.0
    parked: int = 0
    peak_parked: int = 0
    resumed_by_publisher: int = 0
    resumed_by_waiter: int = 0
    errors: list[BaseException] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)


# --- the LangGraph side ------------------------------------------------------------


class Peer:
    """Graphs, pool and the park/resume protocol of one bench process."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, durability: str, savers: int = SAVERS) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.store.postgres.aio import AsyncPostgresStore

        self.pool = pool
        self.durability = durability
        self.savers = [AsyncPostgresSaver(pool) for _ in range(savers)]
        self.store = AsyncPostgresStore(pool)
        self.graphs = build_graphs(self)
        self.tasks: set[asyncio.Task[None]] = set()
        self.level = Level(0)

    # tables

    async def reset_tables(self) -> None:
        async with self.pool.connection() as conn:
            for table in (*LANGGRAPH_TABLES, *PEER_TABLES):
                await conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
            for statement in PEER_DDL:
                await conn.execute(statement)
        await self.savers[0].setup()
        await self.store.setup()

    # runs

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """A task in a fresh context, so a resume started inside a publisher's tool
        is not taken for a child of that tool's run."""
        task = asyncio.create_task(work, context=contextvars.Context())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drive(self, role: str, thread_id: str, cid: str, payload: Any) -> None:
        level = self.level
        try:
            await self._drive(role, thread_id, cid, payload)
        except Exception as exc:  # recorded and re-raised by run_level: the level fails
            level.errors.append(exc)
            level.finished.set()

    async def _drive(self, role: str, thread_id: str, cid: str, payload: Any) -> None:
        from langgraph.types import Command

        config = {"configurable": {"thread_id": thread_id, "role": role}}
        graphs = self.graphs[role]
        graph = graphs[int(thread_id.removeprefix("r_"), 16) % len(graphs)]
        while True:
            out = await graph.ainvoke(payload, config, durability=self.durability, version="v2")
            if not out.interrupts:
                self._run_finished(role, cid)
                return
            channel = out.interrupts[0].value["channel"]
            if not await self._park(thread_id, role, cid, channel):
                return  # parked: a publisher resumes it
            payload = Command(resume={"channel": channel, "resumed_by": thread_id})

    async def _park(self, thread_id: str, role: str, cid: str, channel: str) -> bool:
        """Record the interrupted thread as a waiter, then look again for a message
        published meanwhile; True if this task claimed its own waiter back."""
        level = self.level
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO lg_waiters (thread_id, channel, role, circuit_id) VALUES (%s, %s, %s, %s)",
                (thread_id, channel, role, cid),
            )
            level.parked += 1
            level.peak_parked = max(level.peak_parked, level.parked)
            cur = await conn.execute(
                """SELECT 1 FROM lg_channel_messages m
                   WHERE m.channel = %s
                     AND m.id > coalesce((SELECT cursor FROM lg_channel_cursors WHERE channel = %s), 0)
                   LIMIT 1""",
                (channel, channel),
            )
            if await cur.fetchone() is None:
                return False
            cur = await conn.execute("DELETE FROM lg_waiters WHERE thread_id = %s RETURNING thread_id", (thread_id,))
            if await cur.fetchone() is None:
                return False  # the publisher claimed it and resumes it
        level.parked -= 1
        level.resumed_by_waiter += 1
        return True

    def _run_finished(self, role: str, cid: str) -> None:
        level = self.level
        now = time.perf_counter()
        if role == "evaluator":
            level.circuit_done[cid] = now
        level.last_run_done = now
        level.runs_left -= 1
        if level.runs_left == 0:
            level.finished.set()

    # tools' storage

    async def publish(self, channel: str, value: dict[str, Any], publisher: str) -> dict[str, Any]:
        from langgraph.types import Command

        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """INSERT INTO lg_channel_messages (channel, value, published_by) VALUES (%s, %s, %s)
                   RETURNING id, published_at""",
                (channel, Jsonb(value), publisher),
            )
            row = await cur.fetchone()
            cur = await conn.execute(
                "DELETE FROM lg_waiters WHERE channel = %s RETURNING thread_id, role, circuit_id", (channel,)
            )
            waiters = await cur.fetchall()
        assert row is not None
        level = self.level
        for waiter in waiters:
            level.parked -= 1
            level.resumed_by_publisher += 1
            resume = Command(resume={"channel": channel, "resumed_by": publisher})
            self.spawn(self.drive(waiter["role"], waiter["thread_id"], waiter["circuit_id"], resume))
        return {"msg_id": f"msg_{row['id']}", "channel": channel, "created_at": row["published_at"].isoformat()}

    async def subscribe(self, channel: str, max_messages: int) -> dict[str, Any]:
        """Read after the channel's committed cursor and commit it past what was read."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO lg_channel_cursors (channel) VALUES (%s) ON CONFLICT (channel) DO NOTHING", (channel,)
            )
            cur = await conn.execute("SELECT cursor FROM lg_channel_cursors WHERE channel = %s FOR UPDATE", (channel,))
            committed = await cur.fetchone()
            assert committed is not None
            cur = await conn.execute(
                """SELECT id, value, published_at FROM lg_channel_messages
                   WHERE channel = %s AND id > %s ORDER BY id LIMIT %s""",
                (channel, committed["cursor"], max_messages),
            )
            rows = await cur.fetchall()
            if rows:
                await conn.execute(
                    "UPDATE lg_channel_cursors SET cursor = %s WHERE channel = %s", (rows[-1]["id"], channel)
                )
        messages = [
            {"id": f"msg_{r['id']}", "value": r["value"], "published_at": r["published_at"].isoformat()} for r in rows
        ]
        return {"channel": channel, "messages": messages, "next_cursor": f"cur_{rows[-1]['id']}" if rows else ""}

    async def submit_evaluation(self, run_id: str, score: float, rationale: str, evaluator: str) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1", (run_id,))
            if await cur.fetchone() is None:
                return {"error": f"run {run_id!r} not found"}
            cur = await conn.execute(
                """INSERT INTO lg_evaluations (run_id, score, rationale, evaluator_run_id)
                   VALUES (%s, %s, %s, %s) RETURNING id, created_at""",
                (run_id, score, rationale, evaluator),
            )
            row = await cur.fetchone()
        assert row is not None
        return {
            "eval_id": f"ev_{row['id']}",
            "run_id": run_id,
            "score": score,
            "created_at": row["created_at"].isoformat(),
        }

    # levels

    async def run_level(self, circuits: int) -> dict[str, Any]:
        level = Level(circuits, runs_left=3 * circuits)
        self.level = level
        cids = [f"c{i}" for i in range(1, circuits + 1)]
        level.threads = {cid: {role: f"r_{secrets.token_hex(8)}" for role in ROLES} for cid in cids}
        level.started = time.perf_counter()
        cpu_started = time.process_time()
        for cid in cids:  # all three runs of every circuit at once
            for role in ROLES:
                start = {"messages": [{"role": "user", "content": circuit_prompt(cid)}]}
                self.spawn(self.drive(role, level.threads[cid][role], cid, start))
        try:
            await asyncio.wait_for(level.finished.wait(), timeout=LEVEL_TIMEOUT_S)
        except TimeoutError as exc:
            raise RuntimeError(
                f"{circuits} circuits: {level.runs_left} runs unfinished after {LEVEL_TIMEOUT_S:.0f}s "
                f"({level.parked} parked)"
            ) from exc
        if level.errors:
            raise RuntimeError(f"{circuits} circuits: {len(level.errors)} runs failed") from level.errors[0]
        elapsed = level.last_run_done - level.started
        cpu_s = time.process_time() - cpu_started
        latencies_ms = [(level.circuit_done[cid] - level.started) * 1000 for cid in cids]
        return {
            "circuits": circuits,
            "elapsed_s": elapsed,
            "cpu_ms_per_circuit": cpu_s * 1000 / circuits,
            "circuits_per_s": circuits / elapsed,
            "runs_per_s": 3 * circuits / elapsed,
            "p50_ms": percentile(latencies_ms, 0.50),
            "p99_ms": percentile(latencies_ms, 0.99),
            "peak_parked": level.peak_parked,
            "resumed_by_publisher": level.resumed_by_publisher,
            "resumed_by_waiter": level.resumed_by_waiter,
            **await self.validate(level),
        }

    async def validate(self, level: Level) -> dict[str, Any]:
        """Every circuit has its 3 memory keys and exactly 1 evaluation, of its
        editor's run, with the scripted score; no waiter is left."""
        prefix = ".".join(NAMESPACE)
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT key FROM store WHERE prefix = %s", (prefix,))
            keys = {row["key"] for row in await cur.fetchall()}
            cur = await conn.execute("SELECT run_id, score, evaluator_run_id FROM lg_evaluations")
            evaluations = await cur.fetchall()
            cur = await conn.execute("SELECT count(*) AS n FROM lg_waiters")
            waiters = await cur.fetchone()
        by_run: dict[str, list[dict[str, Any]]] = {}
        for row in evaluations:
            by_run.setdefault(row["run_id"], []).append(row)
        bad: list[str] = []
        memory_ok = evaluations_ok = 0
        for cid, threads in level.threads.items():
            wanted = {f"{cid}-research", f"{cid}-research-edited", f"{cid}-research-scored"}
            memory_ok += len(wanted & keys)
            rows = by_run.get(threads["editor"], [])
            good = (
                len(rows) == 1
                and rows[0]["evaluator_run_id"] == threads["evaluator"]
                and rows[0]["score"] == derive_score(threads["editor"] + cid)
            )
            evaluations_ok += good
            if not good or not wanted <= keys:
                bad.append(cid)
        assert waiters is not None
        if bad or len(evaluations) != level.circuits or waiters["n"]:
            raise RuntimeError(
                f"validation failed: circuits {bad[:10]} incomplete; {len(evaluations)} evaluations for "
                f"{level.circuits} circuits; {waiters['n']} waiters left"
            )
        return {"memory_keys_ok": memory_ok, "evaluations_ok": evaluations_ok}


def build_graphs(peer: Peer) -> dict[str, list[Any]]:
    """Per role, one compiled ReAct graph per saver: fake model node + ToolNode."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, ToolRuntime, tools_condition
    from langgraph.types import interrupt

    class ScriptedCircuitModel(BaseChatModel):
        """Zero-latency fake chat model playing one circuit role's script."""

        role: str

        @property
        def _llm_type(self) -> str:
            return f"mock-{self.role}"

        def _reply(self, messages: list[BaseMessage]) -> ChatResult:
            prompt = next((m.text for m in messages if isinstance(m, HumanMessage)), "")
            results = [m.text for m in messages if isinstance(m, ToolMessage)]
            step = script_step(self.role, circuit_id(prompt), results)
            chars = sum(len(m.text) for m in messages)
            if step is None:
                reply = AIMessage(content="done")
            else:
                text, name, args = step
                call_id = f"mock_tu_{secrets.token_hex(8)}"
                reply = AIMessage(content=text, tool_calls=[{"name": name, "args": args, "id": call_id}])
                chars += len(json.dumps(args))
            out_tokens = len(reply.text) // 4 + sum(len(json.dumps(c["args"])) // 4 for c in reply.tool_calls)
            in_tokens = max(1, chars // 4)
            reply.usage_metadata = {
                "input_tokens": in_tokens,
                "output_tokens": out_tokens,
                "total_tokens": in_tokens + out_tokens,
            }
            return ChatResult(generations=[ChatGeneration(message=reply)])

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
        ) -> ChatResult:
            return self._reply(messages)

        async def _agenerate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
        ) -> ChatResult:
            return self._reply(messages)

    def thread_of(runtime: ToolRuntime) -> str:
        return str(runtime.config["configurable"]["thread_id"])

    def failed(message: str) -> str:
        return json.dumps({"error": message})

    @tool("Memory")
    async def memory_tool(
        op: str, key: str, runtime: ToolRuntime, scope: str = "user", value: dict[str, Any] | None = None
    ) -> str:
        """User-scoped memory: set (key, value) or get (key)."""
        store = runtime.store
        if scope != "user" or store is None:
            return failed(f"scope {scope!r} not granted")
        if op == "set":
            if value is None:
                return failed("set: missing required field: value")
            await store.aput(NAMESPACE, key, value)
            return json.dumps({"ok": True, "key": key, "scope": scope})
        if op == "get":
            item = await store.aget(NAMESPACE, key)
            found = item is not None
            return json.dumps({"key": key, "scope": scope, "found": found, "value": item.value if item else None})
        return failed(f"unknown op {op!r}")

    @tool("Channel")
    async def channel_tool(
        op: str,
        channel: str,
        runtime: ToolRuntime,
        value: dict[str, Any] | None = None,
        max_messages: int = 10,
        wait_ms: int = 0,
    ) -> str:
        """Publish (channel, value) or subscribe (channel, max_messages, wait_ms: wait for a message)."""
        if op == "publish":
            if value is None:
                return failed("publish: missing required field: value")
            return json.dumps(await peer.publish(channel, value, thread_of(runtime)), default=str)
        if op == "subscribe":
            read = await peer.subscribe(channel, min(max(1, max_messages), MAX_MESSAGES_CAP))
            if not read["messages"] and wait_ms > 0:
                # Parks the thread. A resume re-runs this tool from the top, and the
                # read above then finds the message. Execution only gets past this
                # call on a resume that found nothing, which gives an empty result.
                interrupt({"channel": channel, "wait_ms": wait_ms})
            return json.dumps(read, default=str)
        return failed(f"unknown op {op!r}")

    @tool("Context")
    async def context_tool(op: str, runtime: ToolRuntime) -> str:
        """op=self: this run's identity."""
        if op != "self":
            return failed(f"unknown op {op!r}")
        thread_id = thread_of(runtime)
        agent = str(runtime.config["configurable"].get("role", ""))
        return json.dumps(
            {
                "run_id": thread_id,
                "agent_name": agent,
                "user_id": USER_ID,
                "tenant_id": "default",
                "user_tier": "default",
            }
        )

    @tool("Evaluation")
    async def evaluation_tool(
        op: str, runtime: ToolRuntime, run_id: str = "", score: float | None = None, rationale: str = ""
    ) -> str:
        """op=submit: record an evaluation (run_id, score 0..1, rationale) of another run."""
        if op != "submit":
            return failed(f"unknown op {op!r}")
        if not run_id:
            return failed("submit: missing required field: run_id")
        if score is None or not 0 <= score <= 1:
            return failed("submit needs a score (a number between 0 and 1)")
        return json.dumps(await peer.submit_evaluation(run_id, score, rationale, thread_of(runtime)))

    tools_by_role = {
        "researcher": [memory_tool, channel_tool, context_tool],
        "editor": [memory_tool, channel_tool, context_tool],
        "evaluator": [memory_tool, channel_tool, evaluation_tool, context_tool],
    }
    graphs: dict[str, list[Any]] = {}
    for role in ROLES:
        model = ScriptedCircuitModel(role=role)

        async def call_model(state: MessagesState, model: ScriptedCircuitModel = model) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", call_model)
        builder.add_node("tools", ToolNode(tools_by_role[role]))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition)
        builder.add_edge("tools", "model")
        graphs[role] = [builder.compile(checkpointer=saver, store=peer.store, name=role) for saver in peer.savers]
    return graphs


# --- the driver ------------------------------------------------------------------


def result_keys(results: dict[int, dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, r in results.items():
        out[f"lg_circuits_per_s_{n}"] = round(r["circuits_per_s"], 2)
        out[f"lg_runs_per_s_{n}"] = round(r["runs_per_s"], 2)
        out[f"lg_peak_parked_{n}"] = float(r["peak_parked"])
        out[f"lg_p50_ms_{n}"] = round(r["p50_ms"], 1)
        out[f"lg_p99_ms_{n}"] = round(r["p99_ms"], 1)
    return out


def _report(r: dict[str, Any], wall: float) -> None:
    n = r["circuits"]
    print(
        f"[{n} circuits] {3 * n} runs in {r['elapsed_s']:.2f}s: circuits/s={r['circuits_per_s']:.2f} "
        f"runs/s={r['runs_per_s']:.2f} (bench process CPU {r['cpu_ms_per_circuit']:.0f} ms/circuit) | "
        f"circuit latency p50={r['p50_ms']:.0f}ms p99={r['p99_ms']:.0f}ms | "
        f"peak parked={r['peak_parked']} (resumed by publisher {r['resumed_by_publisher']}, by the waiter's "
        f"re-check {r['resumed_by_waiter']}) | valid: memory keys {r['memory_keys_ok']}/{3 * n}, evaluations "
        f"{r['evaluations_ok']}/{n} | level wall incl. table reset + validation {wall:.1f}s",
        flush=True,
    )


@dataclass(frozen=True)
class Options:
    database: str = DEFAULT_DATABASE  # created on the DSN's server; "" = the DSN's own database
    durability: str = "sync"  # LangGraph's: sync | async | exit
    pool_max: int = POOL_MAX
    savers: int = SAVERS  # AsyncPostgresSaver instances sharing the pool (see SAVERS)

    def argv(self) -> list[str]:
        return [
            f"--database={self.database}",
            f"--durability={self.durability}",
            f"--pool-max={self.pool_max}",
            f"--savers={self.savers}",
        ]


async def arun_levels(dsn: str, levels: list[int], options: Options | None = None) -> dict[str, float]:
    opts = options or Options()
    conninfo = ensure_database(dsn, opts.database)
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, min_size=opts.pool_max, max_size=opts.pool_max, kwargs=kwargs, timeout=POOL_WAIT_S, open=False
    )
    await pool.open(wait=True, timeout=60)
    try:
        import langgraph.version

        peer = Peer(pool, durability=opts.durability, savers=opts.savers)
        print(
            f"LangGraph {langgraph.version.__version__} circuit peer: asyncio in ONE process (1 core); "
            f"{opts.savers} AsyncPostgresSaver (durability={opts.durability}) + AsyncPostgresStore + SQL "
            f"channels/evaluations on one AsyncConnectionPool (max {opts.pool_max}); database "
            f"{opts.database or '(the DSN)'}; zero-latency scripted model",
            flush=True,
        )
        await peer.reset_tables()
        warm = await peer.run_level(WARMUP_CIRCUITS)
        print(f"warm-up: {WARMUP_CIRCUITS} circuits OK in {warm['elapsed_s']:.2f}s", flush=True)
        results: dict[int, dict[str, Any]] = {}
        for n in levels:
            begun = time.perf_counter()
            await peer.reset_tables()
            results[n] = await peer.run_level(n)
            _report(results[n], time.perf_counter() - begun)
    finally:
        await pool.close()
    return result_keys(results)


def run_levels(dsn: str, levels: list[int], options: Options | None = None) -> dict[str, float]:
    """The peer's figures per level (`lg_<figure>_<circuits>`). Runs in this process if
    it has LangGraph, else as `.venv-peer/bin/python bench/langgraph_circuit.py`, whose
    output is passed through."""
    if importlib.util.find_spec("langgraph") is not None:
        return asyncio.run(arun_levels(dsn, levels, options))
    if not PEER_PYTHON.exists():
        raise RuntimeError(
            f"{PEER_PYTHON} missing: python3 -m venv .venv-peer && "
            ".venv-peer/bin/pip install -r requirements/bench-peer.txt"
        )
    args = [str(PEER_PYTHON), str(Path(__file__).resolve()), "--dsn", dsn, "--levels", ",".join(map(str, levels))]
    proc = subprocess.run(
        [*args, *(options or Options()).argv()],
        capture_output=True,
        text=True,
        timeout=LEVEL_TIMEOUT_S * (len(levels) + 1),
    )
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"LangGraph peer failed (exit {proc.returncode})")
    return parse_result_line(proc.stdout)


def parse_result_line(output: str) -> dict[str, float]:
    line = next(line for line in reversed(output.splitlines()) if line.startswith(RESULT_LINE_PREFIX))
    return {k: float(v) for k, v in (pair.split("=", 1) for pair in line.split())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="Postgres conninfo or URL (its server hosts --database)")
    parser.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)), help="concurrent circuits per level")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="dedicated database ('' = the DSN's own)")
    parser.add_argument("--durability", default="sync", choices=("sync", "async", "exit"))
    parser.add_argument("--pool-max", type=int, default=POOL_MAX)
    parser.add_argument("--savers", type=int, default=SAVERS, help="AsyncPostgresSaver instances on the pool")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    options = Options(args.database, args.durability, args.pool_max, args.savers)
    figures = asyncio.run(arun_levels(args.dsn, levels, options))
    print(" ".join(f"{k}={v:g}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
