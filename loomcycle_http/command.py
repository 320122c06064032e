"""The `loomcycle` script's entry point: the command line when its extra is installed, else one
line saying how to install it (the client library installs without click, rich and PyYAML)."""

from __future__ import annotations

import sys

INSTALL_HINT = "loomcycle: the command line needs its extra: pip install 'loomcycle-http[cli]'"


def main() -> None:
    try:
        from loomcycle_http.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if exc.name in ("click", "rich", "yaml"):
            sys.exit(f"{INSTALL_HINT} ({exc.name} is missing)")
        raise
    cli_main()
