"""How the command line shows things: answers on stdout, everything else on stderr.

Invariants:
- stdout carries only the answer (a run's `text`), or JSON lines with `--json`, or a
  command's result, so pipes compose; progress, tool calls, usage and errors go to stderr.
- The spinner exists only while stderr is a terminal; piped, stderr gets plain lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner as RichSpinner

from loomcycle_http.client import Event

err = Console(stderr=True, highlight=False, soft_wrap=True)
PREVIEW = 200


def clip(value: Any, limit: int = PREVIEW) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_out(text: str) -> None:
    """Answer text on stdout, newline-terminated, flushed at once (so a pipe sees it as it comes)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def write_piece(text: str) -> None:
    """A piece of answer text on stdout as is (live text), flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()


def print_json(value: Any) -> None:
    write_out(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def note(message: str, style: str = "dim") -> None:
    err.print(f"[{style}]{escape(message)}[/{style}]")


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {escape(message)}")


def age(started_at: str | None) -> str:
    """`3s`, `4m`, `2h`, `5d` since an ISO time ("-" when absent)."""
    if not started_at:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(started_at.replace("Z", "+00:00"))).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def tokens(usage: Any) -> int:
    if not isinstance(usage, dict):
        return 0
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


def summary(event: Event) -> str:
    """One line about an event that is not answer text (for stderr, and for `logs`)."""
    kind, data = event.type, event.data
    if kind == "tool_call":
        use = event.tool_use
        return f"→ {use.get('name')} {clip(use.get('input') or {})}"
    if kind == "tool_result":
        mark = " (error)" if data.get("is_error") else ""
        return f"← {event.tool_use.get('name')}{mark}: {clip(event.text)}"
    if kind == "usage":
        use = event.usage
        return f"usage: {use.get('input_tokens', 0)} in, {use.get('output_tokens', 0)} out ({use.get('model', '')})"
    if kind in ("text", "thinking"):
        return clip(event.text)
    if kind == "steer":
        return f"» {clip(data.get('user_input', {}).get('text', ''))}"
    if kind == "done":
        return f"done: {data.get('stop_reason', '')}" + (" (cancelled)" if data.get("cancelled") else "")
    if kind == "error":
        return f"error: {event.error}"
    if kind == "agent":
        return f"run {data.get('run_id')} (agent_id {data.get('agent_id')})"
    rest = {k: v for k, v in data.items() if k != "type"}
    return f"{kind} {clip(rest)}" if rest else kind


class Spinner:
    """A one-line spinner on stderr (rich Live); `update` changes its text."""

    def __init__(self, live: Live, spin: RichSpinner) -> None:
        self._live, self._spin = live, spin

    def update(self, text: str) -> None:
        self._spin.update(text=text)
        self._live.refresh()


@contextmanager
def spinner(label: str, enabled: bool) -> Iterator[Spinner | None]:
    """A spinner on stderr when `enabled` and stderr is a terminal; None otherwise.
    stdout is redirected through the live display only when it is that terminal too:
    a piped or redirected stdout keeps getting the answer, never the spinner's stream."""
    if not (enabled and err.is_terminal):
        yield None
        return
    spin = RichSpinner("dots", text=label)
    with Live(spin, console=err, transient=True, redirect_stdout=sys.stdout.isatty(), redirect_stderr=False) as live:
        yield Spinner(live, spin)
