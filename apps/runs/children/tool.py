"""The `Agent` tool (SPEC 6.4): its ops, each handed to the room that owns it.
`spawn` asks the engine to start one child (apps.runs.children.spawn), `parallel_spawn`
is a join (apps.runs.children.fanout), and open/send/poll/cancel/close are resident
children (apps.runs.children.resident_tool)."""

from __future__ import annotations

from typing import Any

from apps.core.ids import is_ident
from apps.core.tools import SpawnRequest, Tool, ToolContext, ToolResult
from apps.runs.children import fanout
from apps.runs.children.resident_tool import OPS as RESIDENT_OPS
from apps.runs.children.resident_tool import resident_execute


def agent_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    op = data.get("op", "spawn")
    if op == "parallel_spawn":  # one park for up to 32 children (apps.runs.children.fanout)
        return fanout.parallel_spawn_execute(ctx, data)
    if op in RESIDENT_OPS:  # resident children (apps.runs.children.resident_tool)
        return resident_execute(ctx, data)
    if op != "spawn":
        return ToolResult(
            f"op {op!r} is unknown; one of spawn, parallel_spawn, {', '.join(RESIDENT_OPS)}", is_error=True
        )
    name, prompt = data.get("name"), data.get("prompt")
    if not isinstance(name, str) or not is_ident(name):
        return ToolResult("name must be an agent name ([A-Za-z0-9_-]{1,128})", is_error=True)
    if not isinstance(prompt, str) or not prompt.strip():
        return ToolResult("prompt must be a non-empty string", is_error=True)
    return ToolResult("", spawn=SpawnRequest(agent=name, prompt=prompt))


AGENT_TOOL = Tool(
    name="Agent",
    description="Run a sub-agent: op=spawn with {name, prompt}. The result is the sub-agent's final text, "
    "prefixed with [sub-agent agent_id=...]. op=parallel_spawn with spawns:[{name, prompt, parent_context?}] "
    "(at most 32) runs them all (max_concurrent_children at a time) and answers once with "
    '{"results":[{index, agent, ok, output?, error?}]}, index-aligned. A resident sub-agent stays alive between '
    "messages: op=open {name, prompt} (answers its first reply and child_run_id), op=send {child_run_id, prompt} "
    "(answers its reply), op=poll {child_run_id}, op=cancel {child_run_id}, op=close {child_run_id}.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["spawn", "parallel_spawn", *RESIDENT_OPS]},
            "name": {"type": "string"},
            "prompt": {"type": "string"},
            "spawns": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "prompt": {"type": "string"},
                        "parent_context": {"type": "object"},
                    },
                    "required": ["name", "prompt"],
                },
            },
            "child_run_id": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1},
            "idle_ttl_seconds": {"type": "integer", "minimum": 1},
        },
    },
    execute=agent_execute,
)
