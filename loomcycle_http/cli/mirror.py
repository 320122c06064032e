"""`loomcycle mirror DIR`: keep a plain-file view of the runtime in DIR (docs/cli.md)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from loomcycle_http.cli import output
from loomcycle_http.cli.context import EXIT_REFUSED, Ctx, pass_ctx
from loomcycle_http.mirror import Mirror, MirrorBusy, dir_lock


@click.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--once", is_flag=True, help="sync (and deliver waiting inbox files) once, then exit")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="seconds between passes"
)
@pass_ctx
def mirror(ctx: Ctx, directory: Path, once: bool, interval: float) -> None:
    """Mirror runs into DIR/agents/<name>/... and deliver files dropped into DIR/agents/<name>/inbox/."""
    the_mirror = Mirror(ctx.client, directory, log=output.note)
    try:
        with dir_lock(directory):
            if once:
                the_mirror.sync_until_settled()
                return
            stop = threading.Event()

            def _stop(signum: int, frame: FrameType | None) -> None:
                stop.set()

            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
            output.note(f"mirroring {ctx.client.url} into {directory} (every {interval:g} s; Ctrl-C stops)")
            the_mirror.run_until(stop, interval)
    except MirrorBusy as exc:
        output.fail(str(exc))
        raise SystemExit(EXIT_REFUSED) from exc
