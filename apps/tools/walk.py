"""Listing and glob matching for Glob and Grep, bounded.

Invariants:
- Matching never backtracks more than one step: a glob is a list of tokens
  matched by the classic two-pointer wildcard algorithm (O(len(name) * len(glob))
  per segment), `**` the same algorithm over path segments. No regex is built
  from a model's pattern, so no pattern can take exponential time.
- A listing walks directory descriptors (os.fwalk, no symlink followed): a
  directory swapped for a symlink during the walk is not entered, so no name
  outside the base is listed.
- Every listing has a budget: a deadline, the run's cancel and a cap on the
  entries scanned; `Budget.check` runs once per directory and per file.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class GlobInvalid(Exception):
    """A glob that cannot be matched (a bad `[..]` class); the text says why."""


class BudgetExceeded(Exception):
    """The call ran past its deadline or the run was cancelled; the text is the is_error."""


@dataclass
class Budget:
    """What one call may spend walking and matching."""

    deadline: float
    cancelled: threading.Event
    max_entries: int
    what: str  # "Glob" / "Grep", for the message
    seconds: float
    scanned: int = 0
    capped: bool = False

    @classmethod
    def start(cls, *, seconds: float, cancelled: threading.Event, max_entries: int, what: str) -> Budget:
        return cls(time.monotonic() + seconds, cancelled, max_entries, what, seconds)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise BudgetExceeded(f"{self.what} stopped: the run was cancelled")
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"{self.what} took longer than {self.seconds:g} s and was stopped; narrow it")

    def left(self) -> float:
        self.check()
        return self.deadline - time.monotonic()


# --- glob matching ---------------------------------------------------------------------

STAR = "*"
ANY = "?"
Token = Any  # STAR, ANY, a literal str of length 1, or a compiled one-character class


def _class(inner: str) -> re.Pattern[str]:
    negate = inner[:1] in ("!", "^")
    body = inner[1:] if negate else inner
    try:
        return re.compile("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
    except re.error as exc:
        raise GlobInvalid(f"invalid character class [{inner}]: {exc.msg}") from exc


def segment_tokens(seg: str) -> list[Token]:
    """One path segment's glob as tokens (`*`, `?`, `[..]`, literals)."""
    out: list[Token] = []
    i = 0
    while i < len(seg):
        c = seg[i]
        close = seg.find("]", i + 2) if c == "[" else -1
        if c == "*":
            if not out or out[-1] is not STAR:
                out.append(STAR)
        elif c == "?":
            out.append(ANY)
        elif close > 0:
            out.append(_class(seg[i + 1 : close]))
            i = close
        else:
            out.append(c)
        i += 1
    return out


def _char_matches(token: Token, ch: str) -> bool:
    if token is ANY:
        return True
    if isinstance(token, str):
        return token == ch
    return token.fullmatch(ch) is not None


def wildcard(tokens: Sequence[Any], items: Sequence[Any], one: Callable[[Any, Any], bool]) -> bool:
    """Two-pointer wildcard match: STAR matches any run of items, every other token
    exactly one item (`one(token, item)`). On a mismatch only the last STAR is retried
    one item further: at most len(items) * len(tokens) steps, no exponential backtracking."""
    t = i = 0
    star_t, star_i = -1, 0
    while i < len(items):
        if t < len(tokens) and tokens[t] is STAR:
            star_t, star_i = t, i
            t += 1
        elif t < len(tokens) and one(tokens[t], items[i]):
            t += 1
            i += 1
        elif star_t >= 0:
            star_i += 1
            t, i = star_t + 1, star_i
        else:
            return False
    while t < len(tokens) and tokens[t] is STAR:
        t += 1
    return t == len(tokens)


@dataclass(frozen=True)
class Glob:
    """A compiled path glob: segments of tokens, `**` (STAR) for any number of segments."""

    segments: tuple[Any, ...]

    @classmethod
    def compile(cls, pattern: str) -> Glob:
        parts = [p for p in pattern.strip("/").split("/") if p]
        if not parts:
            raise GlobInvalid("pattern must name at least one path segment")
        segs: list[Any] = [STAR if p == "**" else segment_tokens(p) for p in parts]
        if segs[-1] is STAR:  # a trailing `**` means every file below: at least one segment
            segs.append([STAR])
        return cls(tuple(segs))

    def match(self, rel: str) -> bool:
        return wildcard(self.segments, rel.split("/"), lambda seg, name: wildcard(seg, name, _char_matches))


def name_matches(pattern: str, name: str) -> bool:
    """One segment's glob against one file name (Grep's `glob`)."""
    return wildcard(segment_tokens(pattern), name, _char_matches)


# --- listing -------------------------------------------------------------------------


def walk_files(base: Path, budget: Budget) -> list[tuple[str, float]]:
    """(path relative to `base`, mtime) of every regular file below it, directories in
    name order, no symlink followed (os.fwalk's descriptors). Stops with `budget.capped`
    set after `budget.max_entries` entries; raises BudgetExceeded past the deadline or on cancel."""
    found: list[tuple[str, float]] = []
    for dirpath, dirnames, filenames, dirfd in os.fwalk(base, follow_symlinks=False):
        budget.check()
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, base)
        for name in sorted(filenames):
            budget.scanned += 1
            if budget.scanned > budget.max_entries:
                budget.capped = True
                return found
            if budget.scanned % 256 == 0:
                budget.check()
            try:
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the directory was listed
            if stat.S_ISREG(info.st_mode):
                found.append((name if rel_dir == "." else f"{rel_dir}/{name}", info.st_mtime))
    return found
