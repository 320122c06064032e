"""A line diff of two definition versions, as the library page shows it: each definition
as sorted, indented JSON (so a moved key is no change), compared by difflib."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

CONTEXT_LINES = 3


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "ctx" | "hunk"
    text: str


def _lines(definition: dict[str, Any]) -> list[str]:
    return json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def definition_diff(old: dict[str, Any], new: dict[str, Any], *, old_label: str, new_label: str) -> list[DiffLine]:
    """Unified diff lines of `old` -> `new` ([] when they are equal)."""
    out: list[DiffLine] = []
    raw = difflib.unified_diff(_lines(old), _lines(new), old_label, new_label, n=CONTEXT_LINES, lineterm="")
    for line in raw:
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            out.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            out.append(DiffLine("add", line[1:]))
        elif line.startswith("-"):
            out.append(DiffLine("del", line[1:]))
        else:
            out.append(DiffLine("ctx", line[1:]))
    return out
