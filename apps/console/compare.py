"""Two runs' timelines side by side, marking where they diverge (the console's comparison page).
A presenter over apps.runs.timeline items: no reads of its own."""

from __future__ import annotations

from dataclasses import dataclass

from apps.runs.timeline import ItemKind, TimelineItem


@dataclass(frozen=True)
class Row:
    item: TimelineItem
    diverged: bool


@dataclass(frozen=True)
class Comparison:
    left: list[Row]
    right: list[Row]
    note: str  # how the shared part was found


def _key(item: TimelineItem) -> tuple[str, str, str]:
    return (item.kind.value, item.text, item.detail)


def fork_comparison(source: list[TimelineItem], fork: list[TimelineItem], at_step: int) -> Comparison:
    """A fork against its source: the fork starts from the source's transcript through
    `at_step` (its `forked` event stands for it), so what the source did after that step and
    everything the fork did after its `forked` event is where they diverge."""
    left = [Row(i, i.step > at_step) for i in source]
    seen_fork = False
    right = []
    for item in fork:
        right.append(Row(item, seen_fork))
        seen_fork = seen_fork or (item.kind == ItemKind.EVENT and item.title == "forked")
    return Comparison(left, right, f"the fork shares the source's transcript through step {at_step}")


def plain_comparison(left: list[TimelineItem], right: list[TimelineItem]) -> Comparison:
    """Two unrelated runs: alike item by item (kind, text, detail) up to the first difference."""
    same = 0
    while same < min(len(left), len(right)) and _key(left[same]) == _key(right[same]):
        same += 1
    return Comparison(
        [Row(i, n >= same) for n, i in enumerate(left)],
        [Row(i, n >= same) for n, i in enumerate(right)],
        f"the first {same} item(s) are alike",
    )
