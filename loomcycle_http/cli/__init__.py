"""The `loomcycle` command line (docs/cli.md), on top of `loomcycle_http.client`."""

from __future__ import annotations

import sys
from typing import Any

import click

from loomcycle_http import __version__
from loomcycle_http.cli import output
from loomcycle_http.cli.budgets import limits, usage
from loomcycle_http.cli.context import EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_UNREACHABLE, Ctx
from loomcycle_http.cli.defs import agent, agents, channel, memory
from loomcycle_http.cli.mirror import mirror
from loomcycle_http.cli.run import run
from loomcycle_http.cli.runs import cancel, logs, pause, ps, resume, send
from loomcycle_http.client import ApiError, ConnectionFailed, LoomcycleError


class _Group(click.Group):
    """Shows a LoomcycleError as one line on stderr with its code, and exits 4 (refused, by the
    API or by the client before sending) or 5 (unreachable); Ctrl-C exits 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            output.fail(f"{exc.code}: {exc.message}")
            sys.exit(EXIT_REFUSED)
        except ConnectionFailed as exc:
            output.fail(f"cannot reach the runtime: {exc.message}")
            sys.exit(EXIT_UNREACHABLE)
        except LoomcycleError as exc:  # refused by the client itself, before any write
            output.fail(f"{exc.code}: {exc.message}")
            sys.exit(EXIT_REFUSED)
        except KeyboardInterrupt:  # Ctrl-C in `logs -f`, `channel tail -f`, ...: nothing to undo
            sys.exit(EXIT_INTERRUPTED)
        finally:
            if isinstance(ctx.obj, Ctx):
                ctx.obj.close()


@click.group(cls=_Group)
@click.option("--url", envvar="LOOMCYCLE_URL", help="the runtime (LOOMCYCLE_URL; default http://127.0.0.1:8787)")
@click.option("--token", envvar="LOOMCYCLE_TOKEN", help="a bearer token (LOOMCYCLE_TOKEN; none in open mode)")
@click.version_option(__version__, prog_name="loomcycle")
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Drive a loomcycle runtime from the shell."""
    ctx.obj = Ctx(url=url, token=token)


for command in (run, ps, logs, send, cancel, pause, resume, agents, agent, memory, channel, usage, limits):
    cli.add_command(command)
cli.add_command(mirror)


def main() -> None:
    cli(prog_name="loomcycle")
