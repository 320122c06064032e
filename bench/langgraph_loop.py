#!/usr/bin/env python
"""The LangGraph peer of the engine phase (`make bench-peer`, bench/peer.py), run in .venv-peer.

The workload of bench/loop.py's engine phase, built the idiomatic LangGraph way: a ReAct graph
(model node + ToolNode, routed by `tools_condition`) whose model is a deterministic fake
`BaseChatModel` with zero latency. Each run has ITERS model calls: ITERS - 1 of them call one
trivial tool, the last answers (bench/agents.yaml's `loop10`: 9 `Context` calls and an answer).
The first message carries a ~4 KB context, as the floor's row does. Checkpoints go to Postgres
through `AsyncPostgresSaver` on one psycopg `AsyncConnectionPool` (max POOL_MAX connections),
with LangGraph's default durability ("async": each step's checkpoint is written while the next
step runs) unless `--durability` says otherwise.

`--setup` creates the checkpointer's tables and exits (the driver runs it once first: two
processes running `setup()` at once collide on its migrations table). One process: `--runs`
runs, at most `--concurrent` at a time, after a warm-up of 10 runs and a wait until the
wall-clock `--start-at` (so several processes start together). Prints one line
`PEER_JSON {...}` with its start, end, CPU seconds, runs and iterations, then keeps its
connections open until a line arrives on stdin. An iteration is one model call, as
in the engine (one model call and its tool calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import sys
import time
import uuid
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

POOL_MAX = 10
_rnd = random.Random(11)
CONTEXT = "".join(_rnd.choices(string.ascii_letters + " ", k=4000))


@tool
def context(step: int) -> str:
    """Report where the run is (the engine's `Context` tool: a few fields, no I/O)."""
    return json.dumps({"step": step, "ok": True})


class ScriptedModel(BaseChatModel):
    """Calls `context` while fewer than `tool_iters` tool results are in the history, then answers."""

    tool_iters: int = 9

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _decide(self, messages: list[BaseMessage]) -> AIMessage:
        n = sum(isinstance(m, ToolMessage) for m in messages)
        if n < self.tool_iters:
            call = {"name": "context", "args": {"step": n}, "id": f"call_{n}", "type": "tool_call"}
            return AIMessage(content=f"step {n}", tool_calls=[call])
        return AIMessage(content="done")

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._decide(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._decide(messages))])


def build(saver: AsyncPostgresSaver, iters: int) -> Any:
    model = ScriptedModel(tool_iters=iters - 1)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([context]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


async def one_run(graph: Any, iters: int, durability: str) -> None:
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * iters}
    out = await graph.ainvoke({"messages": [HumanMessage(content=CONTEXT)]}, cfg, durability=durability)
    if out["messages"][-1].content != "done" or len(out["messages"]) != 2 * iters:
        raise RuntimeError(f"unexpected end of run: {out['messages'][-1]!r}")


async def main(args: argparse.Namespace) -> None:
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = AsyncConnectionPool(args.dsn, min_size=2, max_size=POOL_MAX, kwargs=kwargs, open=False)
    await pool.open(wait=True, timeout=30)
    saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
    if args.setup:  # the checkpointer's tables, once, before the measured processes start
        await saver.setup()
        await pool.close()
        return
    graph = build(saver, args.iters)
    for _ in range(10):
        await one_run(graph, args.iters, args.durability)
    gate = asyncio.Semaphore(args.concurrent)

    async def gated() -> None:
        async with gate:
            await one_run(graph, args.iters, args.durability)

    while time.time() < args.start_at:
        await asyncio.sleep(0.005)
    t0, cpu0 = time.time(), time.process_time()
    await asyncio.wait_for(asyncio.gather(*(gated() for _ in range(args.runs))), timeout=600)
    t1, cpu1 = time.time(), time.process_time()
    line = {"t0": t0, "t1": t1, "cpu_s": cpu1 - cpu0, "runs": args.runs, "iterations": args.runs * args.iters}
    print("PEER_JSON " + json.dumps(line), flush=True)
    # The pool's connections stay open until the driver has read Postgres's CPU: a backend
    # that has exited no longer shows its CPU time.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--durability", default="async", choices=("async", "sync", "exit"))
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--setup", action="store_true", help="create the checkpointer's tables and exit")
    asyncio.run(main(parser.parse_args()))
