"""`manage.py up`'s children's output, one line at a time, prefixed with the child's name
(web, worker0, beat, flower, grpc) so interleaved logs stay readable, as foreman and
docker compose print them. The prefix is coloured only when `up`'s stdout is a terminal
(and NO_COLOR is unset): a log file or a pipe gets plain text.

Each child's stdout and stderr are one pipe; a daemon thread per child copies its lines to
`up`'s stdout under a lock, so lines of two children never interleave mid-line.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, TextIO

# ANSI foreground colours, cycled over the children in start order.
COLOURS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95)
RESET = "\033[0m"


def colour_wanted(out: TextIO) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR")


class Prefixer:
    """Copies children's output to `out`, each line prefixed with its child's name."""

    def __init__(self, out: TextIO | None = None, *, colour: bool | None = None, width: int = 8) -> None:
        self.out = out or sys.stdout
        self.colour = colour_wanted(self.out) if colour is None else colour
        self.width = width
        self._lock = threading.Lock()
        self._colours: dict[str, int] = {}

    def prefix(self, name: str) -> str:
        label = f"{name:<{self.width}} |"
        if not self.colour:
            return label
        code = self._colours.setdefault(name, COLOURS[len(self._colours) % len(COLOURS)])
        return f"\033[{code}m{label}{RESET}"

    def attach(self, name: str, stream: IO[bytes]) -> threading.Thread:
        """Start copying `stream` (a child's merged stdout/stderr) until it closes."""
        thread = threading.Thread(target=self._copy, args=(name, stream), name=f"log-{name}", daemon=True)
        thread.start()
        return thread

    def _copy(self, name: str, stream: IO[bytes]) -> None:
        head = self.prefix(name)
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\r\n")
                with self._lock:
                    self.out.write(f"{head} {line}\n")
                    self.out.flush()
