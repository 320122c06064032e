"""Generates apps/core/presets/env.example (GET /v1/_env_template, `loomcycle env-template`):
every non-secret variable loomcycle_project/env.py reads, with its default from the code and
its meaning from docs/configuration.md's tables. `python -m tests.core.env_template` rewrites
the file; tests/core/test_presets.py fails when it is out of date."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "apps/core/presets/env.example"
# Secrets belong in a file of their own; the embedded flag is set by the runtime itself.
_SECRET = re.compile(r"(TOKEN|PEPPER|SECRET|_API_KEY)$|^(DATABASE_URL|REDIS_URL|DJANGO_SECRET_KEY)$")
_INTERNAL = frozenset({"LOOMCYCLE_EMBEDDED_POSTGRES"})
_HEADER = """\
# loomcycle: the non-secret environment variables and their defaults.
# Secrets (LOOMCYCLE_AUTH_TOKEN, provider keys, DATABASE_URL, REDIS_URL...) are not listed:
# keep them in a file of their own. Uncomment a line to change its value.
# Generated from loomcycle_project/env.py and docs/configuration.md (tests/core/env_template.py).
"""


def read_variables() -> dict[str, Any]:
    """Each variable env.py reads by a literal name, with its literal default (None: none)."""
    found: dict[str, Any] = {}
    for node in ast.walk(ast.parse((ROOT / "loomcycle_project/env.py").read_text())):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name = node.args[0].value
        if not isinstance(name, str) or not re.fullmatch(r"(LOOMCYCLE_[A-Z0-9_]+|[A-Z]+_BASE_URL)", name):
            continue
        if _SECRET.search(name) or name in _INTERNAL:
            continue
        default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
        found.setdefault(name, _literal(default))
    return found


class Computed:
    """A default env.py computes (`24 * 3600`, a function call): the docs' default is shown."""


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Computed()


def documented() -> dict[str, tuple[str, str]]:
    """name -> (default, meaning), from every `| `NAME`[, `NAME`...] | default | meaning |` table row."""
    out: dict[str, tuple[str, str]] = {}
    for line in (ROOT / "docs/configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        meaning = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", " | ".join(cells[2:])).replace("`", "")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0]):
            out.setdefault(name, (cells[1].replace("`", ""), meaning))
    return out


def _value(default: Any, documented_default: str) -> str:
    if isinstance(default, Computed):
        return f"   # default: {documented_default}"
    if default is None:
        return ""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list | tuple):
        return ",".join(map(str, default))
    return str(default)


def generate() -> str:
    meanings = documented()
    blocks = []
    for name, default in sorted(read_variables().items()):
        documented_default, meaning = meanings.get(name, ("", "UNDOCUMENTED"))
        blocks.append(f"# {meaning}\n# {name}={_value(default, documented_default)}\n")
    return _HEADER + "\n" + "\n".join(blocks)


if __name__ == "__main__":
    TEMPLATE.write_text(generate())
    print(f"wrote {TEMPLATE}")
