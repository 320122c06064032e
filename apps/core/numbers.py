"""Non-negative integers read from text a client controls: headers, query strings,
WebSocket query parameters.

`str.isdigit()` is no check for that: it is true for "²" and "٣", which `int()` then
rejects or reads as another digit, and a 5,000-digit value passes it yet makes
`int()` raise (Python's digit limit) or overflows Postgres `bigint` further on.
Every such read goes through `parse_count`: ASCII digits only, at most
MAX_DIGITS of them, or None for the caller to turn into its own 400 or default.
"""

from __future__ import annotations

# 15 digits: below 2**53 (JSON numbers stay exact) and far below Postgres bigint.
MAX_DIGITS = 15


def parse_count(raw: str | None, *, max_digits: int = MAX_DIGITS) -> int | None:
    """`raw` as a non-negative int, or None when it is not 1..max_digits ASCII digits."""
    if not raw or len(raw) > max_digits or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)
