"""The help topics `Context` op=help serves, bundled as package data.

Each topic is one file `apps/runs/help/<name>.md` shipped with the package
(pyproject's package-data): a first line `description: <one line>`, a blank
line, then the markdown body. They are read once per process; a missing or
malformed file fails loudly at first use rather than serving a partial index.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

_PREFIX = "description:"


@dataclass(frozen=True)
class Topic:
    name: str
    description: str
    content: str


def _parse(name: str, text: str) -> Topic:
    first, _, body = text.partition("\n")
    if not first.startswith(_PREFIX) or not body.strip():
        raise ValueError(f"help topic {name!r}: expected `description: ...`, a blank line, then the body")
    return Topic(name=name, description=first[len(_PREFIX) :].strip(), content=body.strip() + "\n")


@functools.cache
def _load() -> dict[str, Topic]:
    folder = resources.files("apps.runs").joinpath("help")
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".md"):
            name = entry.name.removesuffix(".md")
            found[name] = _parse(name, entry.read_text(encoding="utf-8"))
    return dict(sorted(found.items()))


def topics() -> list[Topic]:
    return list(_load().values())


def get(name: str) -> Topic | None:
    return _load().get(name.strip().lower())
