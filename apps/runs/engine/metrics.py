"""The run engine's metrics of work done (apps.core.metrics; docs/operations.md lists them).

Labels are bounded: `outcome` is an engine Outcome, `status` a terminal run
status, `provider`/`model` the candidate the run called (operator-configured
providers; the model of a run that got past validation), `tool` a tool of the
run's effective set ("_not_allowed" for any other name the model produced).
"""

from __future__ import annotations

from apps.core.metrics import Batch, Counter, Histogram

ITERATIONS = Counter(
    "loomcycle_iterations", "Committed agent-loop iterations, by where they left the run.", ("outcome",)
)
ITERATION_SECONDS = Histogram(
    "loomcycle_iteration_seconds", "Wall time of a committed iteration (claim to after-commit), seconds."
)
RUNS_FINISHED = Counter("loomcycle_runs_finished", "Runs the engine brought to a terminal status.", ("status",))
PROVIDER_CALLS = Counter(
    "loomcycle_provider_calls", "Provider call attempts made by the engine.", ("provider", "model", "result")
)
PROVIDER_SECONDS = Histogram(
    "loomcycle_provider_call_seconds", "Provider call attempts' wall time, seconds.", ("provider", "model")
)
TOOL_CALLS = Counter("loomcycle_tool_calls", "Tool calls executed by the engine.", ("tool", "result"))
TOOL_SECONDS = Histogram("loomcycle_tool_call_seconds", "Tool calls' wall time, seconds.", ("tool",))

NOT_ALLOWED = "_not_allowed"


def result_label(is_error: bool) -> str:
    return "error" if is_error else "ok"


__all__ = [
    "ITERATIONS",
    "ITERATION_SECONDS",
    "NOT_ALLOWED",
    "PROVIDER_CALLS",
    "PROVIDER_SECONDS",
    "RUNS_FINISHED",
    "TOOL_CALLS",
    "TOOL_SECONDS",
    "Batch",
    "result_label",
]
