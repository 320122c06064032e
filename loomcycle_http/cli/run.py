"""`loomcycle run`: start a run and stream it (answer on stdout, the rest on stderr).

The answer's text is written as the model produces it (live frames), each model turn's text
ending its line; a live `retry` (the model call was made again, docs/api.md "Live text") ends
the line and is noted on stderr, and the call's text follows again.

Invariants:
- The run gets a client-made agent_id before the request leaves, so Ctrl-C can cancel it
  (POST /v1/agents/{id}/cancel) and then exit 130, whatever the stream did. A Ctrl-C while
  the POST is in flight may find no run yet (404): the cancel is retried for up to
  CANCEL_RETRY_S, so a run created just after is still cancelled.
- A reader that closes stdout (`loomcycle run a | head -1`) cancels the run the same way;
  the command exits 141 (128 + SIGPIPE, as a shell reports a process killed by SIGPIPE).
- The exit code is the run's outcome, read from the runtime once the stream has ended:
  0 completed (or an interactive conversation ended by end of input), 1 failed,
  3 cancelled; a refused request is 4, an unreachable runtime 5.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from loomcycle_http.cli import output
from loomcycle_http.cli.adhoc import ensure_agent
from loomcycle_http.cli.context import EXIT_CANCELLED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Ctx, pass_ctx
from loomcycle_http.client import Client, Event, NotFound
from loomcycle_http.client._base import backoff, new_agent_id
from loomcycle_http.client.live import VOIDS

_QUIET = frozenset({"session", "started", "text", "awaiting_input"})
CANCEL_RETRY_S = 5.0  # how long a cancel keeps asking for a run whose create may not have committed yet
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: stdout's reader went away; the run was cancelled


@dataclass
class Follower:
    """Shows a run's events as they come and remembers how it ended."""

    agent: str
    as_json: bool
    status: output.Spinner | None = None
    run_id: str = ""
    step: int = 0
    last: Event | None = None
    ended_by_input: bool = False  # an interactive conversation the user ended (end of input)
    posted: bool = False  # the POST may have left: a run may exist even before any event came
    line_open: bool = False  # stdout's last answer text did not end its line

    def show(self, event: Event) -> None:
        self.last = event if event.is_terminal else self.last
        if event.type == "agent":
            self.run_id = str(event.data.get("run_id") or "")
        if event.type == "usage":
            self.step += 1
        if self.status is not None:
            self.status.update(f"{self.agent} {self.run_id}: {event.type}, step {self.step}")
        if self.as_json:
            output.write_out(event.to_json())
        elif event.type == "text":
            self._text(event)
        elif event.type in VOIDS and event.seq is None:  # live text voided: the call's text starts again
            self._end_line()
        if event.type == "error":
            output.fail(event.error)
        elif not self.as_json and event.type not in _QUIET:
            output.note(output.summary(event))

    def _text(self, event: Event) -> None:
        """Answer text as it comes (live pieces without an id); a model turn's text ends its line
        with its committed frame (the one with an id)."""
        if event.text:
            output.write_piece(event.text)
            self.line_open = not event.text.endswith("\n")
        if event.seq is not None:
            self._end_line()

    def _end_line(self) -> None:
        if self.line_open:
            output.write_piece("\n")
            self.line_open = False


def _agent_and_prompt(args: tuple[str, ...], model: str | None) -> tuple[str | None, str | None]:
    wanted = 1 if model else 2
    if len(args) > wanted:
        raise click.UsageError("too many arguments: quote the prompt" + (" (with --model, no AGENT)" if model else ""))
    if model:
        return None, args[0] if args else None
    if not args:
        raise click.UsageError("missing AGENT (or --model PROVIDER/MODEL)")
    return args[0], args[1] if len(args) > 1 else None


def _read_prompt(prompt: str | None, interactive: bool) -> str:
    if prompt is None and interactive:
        prompt = _read_turn()  # the first line is the first turn; the rest come turn by turn
    elif prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if not prompt or not prompt.strip():
        raise click.UsageError("no prompt: give PROMPT, or pipe it on stdin")
    return prompt


def _read_turn() -> str | None:
    """One line from the terminal; None at end of input."""
    if sys.stdin.isatty():
        sys.stderr.write("> ")
        sys.stderr.flush()
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _outcome(client: Client, follower: Follower, agent_id: str) -> int:
    run = client.runs.get_by_agent_id(agent_id)
    state = str(run.get("state") or "")
    if state == "completed":
        return EXIT_OK
    if state == "cancelled" and follower.ended_by_input:
        return EXIT_OK
    if state == "cancelled":
        output.fail(f"run {run['run_id']} was cancelled: {run.get('stop_reason') or ''}")
        return EXIT_CANCELLED
    if follower.last is None or follower.last.type != "error":  # an error event has already been shown
        output.fail(f"run {run['run_id']} {state}: {run.get('error') or run.get('stop_reason') or ''}")
    return EXIT_FAILED


def _stream(client: Client, follower: Follower, agent: str, prompt: str, fields: dict[str, Any]) -> None:
    interactive = bool(fields.get("interactive"))
    follower.posted = True  # the first step of the loop below sends the POST
    for event in client.runs.start(agent, prompt, **fields):
        follower.show(event)
        if interactive and event.type == "awaiting_input":
            text = _read_turn()
            if text is None:  # end of input ends the conversation
                follower.ended_by_input = True
                client.runs.cancel(str(fields["agent_id"]), reason="conversation ended (end of input)")
                continue
            if text.strip():
                run_id = follower.run_id or str(client.runs.get_by_agent_id(str(fields["agent_id"]))["run_id"])
                client.runs.input(run_id, text)


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1)
@click.option("--model", help="ad hoc: PROVIDER/MODEL (e.g. ollama/qwen3:8b) instead of AGENT")
@click.option("--system", default="", help="ad hoc: the system prompt")
@click.option("--system-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="ad hoc: from a file")
@click.option("--tool", "tools", multiple=True, help="ad hoc: a tool the agent may use (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print every event as a JSON line on stdout")
@click.option("--background", is_flag=True, help="start the run and print its ids (JSON) without waiting")
@click.option("--interactive", "-i", is_flag=True, help="keep the conversation going: each line is a turn")
@click.option("--user-id", help="the run's user")
@click.option("--agent-id", help="your handle for the run (default: a new a_<16hex>)")
@click.option("--max-iterations", type=int, help="lower the agent's iteration cap")
@pass_ctx
def run(
    ctx: Ctx,
    args: tuple[str, ...],
    model: str | None,
    system: str,
    system_file: Path | None,
    tools: tuple[str, ...],
    as_json: bool,
    background: bool,
    interactive: bool,
    user_id: str | None,
    agent_id: str | None,
    max_iterations: int | None,
) -> None:
    """Run AGENT with PROMPT (or the prompt on stdin) and stream the answer to stdout.

    \b
      loomcycle run echo "hello"
      cat report.txt | loomcycle run summarize > summary.txt
      loomcycle run a "draft it" | loomcycle run b
      loomcycle run --model ollama/qwen3:8b --system "Be terse." "why is the sky blue?"
    """
    name, prompt = _agent_and_prompt(args, model)
    if model:
        text = system_file.read_text() if system_file else system
        name = str(ensure_agent(ctx.client, model, text, list(tools))["name"])
    assert name is not None  # _agent_and_prompt demands AGENT without --model
    prompt = _read_prompt(prompt, interactive)
    fields = {"user_id": user_id, "max_iterations": max_iterations, "interactive": interactive or None}
    if background:
        ref = ctx.client.runs.create(name, prompt, agent_id=agent_id, **fields)
        output.print_json(ref.__dict__)
        return
    handle = agent_id or new_agent_id()
    follower = Follower(agent=name, as_json=as_json)
    try:
        with output.spinner(f"{name}: starting", enabled=not as_json) as status:
            follower.status = status
            _stream(ctx.client, follower, name, prompt, {**fields, "agent_id": handle})
    except KeyboardInterrupt:
        _interrupted(ctx.client, follower, handle)
    except BrokenPipeError:
        _reader_gone(ctx.client, follower, handle)
    sys.exit(_outcome(ctx.client, follower, handle))


def _interrupted(client: Client, follower: Follower, handle: str) -> None:
    """Ctrl-C: cancel the run (if the request made one), then exit 130."""
    if cancel_run(client, handle, "interrupted (Ctrl-C)", posted=follower.posted):
        output.fail(f"interrupted: run {follower.run_id or handle} cancelled")
    else:
        output.fail("interrupted: no run was started")
    sys.exit(EXIT_INTERRUPTED)


def _reader_gone(client: Client, follower: Follower, handle: str) -> None:
    """stdout's reader closed the pipe: nobody reads the answer, so cancel the run and exit 141
    quietly. stdout is pointed at /dev/null first, so the exit's flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    cancel_run(client, handle, "stdout closed", posted=follower.posted)
    sys.exit(EXIT_PIPE_CLOSED)


def cancel_run(client: Client, handle: str, reason: str, *, posted: bool) -> bool:
    """Cancel the run of `handle`; False when there is none. When the POST was sent, a 404 may
    only mean its create has not committed yet: asked again with backoff for CANCEL_RETRY_S."""
    deadline = time.monotonic() + CANCEL_RETRY_S
    attempt = 0
    while True:
        try:
            client.runs.cancel(handle, reason=reason)
            return True
        except NotFound:
            if not posted or time.monotonic() >= deadline:
                return False
        time.sleep(backoff(attempt))  # the create may still be committing
        attempt += 1
