"""Layering of `loomcycle.yaml` files (loomcycle's RFC AN rule): documents fold
left to right; mapping ⊕ mapping merges key by key, anything else (a scalar, a
sequence, or a mapping meeting a non-mapping) is replaced by the later layer.

Invariants:
- `origins` maps the path of every value in the tree (mappings and leaves) to
  the file that put it there; a replaced value's paths, its descendants' too,
  are dropped and re-claimed by the replacing file.
- A replacement is recorded only when the value changes: adding a new key, or
  setting a key again to an equal value (same type and value, so `1` is not
  `true`), is not a replacement, and the earlier file stays its origin.
- Values are compared as written, before `${ENV}` expansion (which runs once on
  the merged whole, see apps.core.config), and never appear in a record.
- A sequence tagged `!prepend` / `!append` (loomcycle's RFC AQ) composes with the
  earlier sequence instead of replacing it: its items go in front / after, a
  repeated item (equal as yaml) is kept once, first occurrence first. A compose is
  not a replacement (nothing is logged, strict mode passes); the composed list is
  claimed by the later file. Over no earlier sequence, a tagged one is set as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Path_ = tuple[str, ...]


class TaggedSeq(list[Any]):
    """A yaml sequence tagged `!prepend` or `!append` (the loader makes them, `fold` composes them)."""

    def __init__(self, items: list[Any], tag: str) -> None:
        super().__init__(items)
        self.tag = tag


def compose(base: list[Any], top: TaggedSeq) -> list[Any]:
    """`top`'s items in front of (`!prepend`) or after (`!append`) `base`'s, each kept once, first first."""
    joined = [*top, *base] if top.tag == "!prepend" else [*base, *top]
    out: list[Any] = []
    for item in joined:
        if not any(same(item, kept) for kept in out):
            out.append(item)
    return out


def untag(value: Any) -> Any:
    """`value` with every TaggedSeq made a plain list (what the merged tree hands on)."""
    if isinstance(value, dict):
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


@dataclass(frozen=True)
class Replacement:
    """A later layer replaced a value an earlier layer set (a cross-layer conflict)."""

    key: str  # dotted path
    earlier: tuple[str, ...]  # the files that set the replaced value (more than one: a merged mapping)
    later: str

    def describe(self) -> str:
        return f"{self.key}: set in {', '.join(self.earlier)}, replaced by {self.later}"


@dataclass
class Layered:
    """The fold so far: the merged tree, who set each path, what was replaced."""

    tree: dict[str, Any] = field(default_factory=dict)
    origins: dict[Path_, str] = field(default_factory=dict)
    replaced: list[Replacement] = field(default_factory=list)

    def fold(self, doc: dict[str, Any], source: str) -> None:
        """Fold one parsed document onto the tree."""
        self.tree = self._fold(self.tree, doc, source, ())

    def _fold(self, base: dict[str, Any], top: dict[str, Any], source: str, path: Path_) -> dict[str, Any]:
        # A new mapping at each merged level, never an update in place: yaml aliases
        # (`b: *a`) share one object, and a merge into `a` must not reach `b`.
        out = dict(base)
        for key, value in top.items():
            here = (*path, str(key))
            if key not in out:
                out[key] = value
                self._claim(here, value, source)
            elif isinstance(out[key], dict) and isinstance(value, dict):
                out[key] = self._fold(out[key], value, source, here)
            elif isinstance(value, TaggedSeq) and isinstance(out[key], list):
                self._release(here)  # a compose, not a replacement: the later file claims the result
                out[key] = compose(out[key], value)
                self._claim(here, out[key], source)
            elif not same(out[key], value):
                self.replaced.append(Replacement(".".join(here), self._release(here), source))
                out[key] = value
                self._claim(here, value, source)
        return out

    def _claim(self, path: Path_, value: Any, source: str) -> None:
        self.origins[path] = source
        if isinstance(value, dict):
            for key, child in value.items():
                self._claim((*path, str(key)), child, source)

    def _release(self, path: Path_) -> tuple[str, ...]:
        """Drop `path` and its descendants; the files that had set them, in layer order, once each."""
        gone = [p for p in self.origins if p[: len(path)] == path]
        files = dict.fromkeys(self.origins.pop(p) for p in gone)
        return tuple(files)


def same(a: Any, b: Any) -> bool:
    """Equal as yaml values: same type all the way down (Python's `True == 1` is not yaml's)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
