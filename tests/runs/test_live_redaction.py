"""The worker's live redaction (apps.runs.livetokens `Tap`) against the real Redis: every text it
publishes is a prefix of the stored (redacted) reply however the provider cuts the reply into
pieces, and each piece redacts a bounded window, not the reply so far (issue 36, CPU per piece)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from apps.core.redact import Redactor
from apps.core.redis import sync_client
from apps.runs.livetokens import Call, Tap, text_key

SECRET = "hunter2-Sesame-0451-x"
WORDS = " ".join(f"word{i:02d}" for i in range(20))


class Measured(Redactor):
    """The run's redactor, noting the longest text one call redacts."""

    longest = 0

    def text(self, s: str) -> str:
        Measured.longest = max(Measured.longest, len(s))
        return super().text(s)


def stream(text: str, cuts: list[int], redactor: Redactor) -> Iterator[tuple[Tap, str]]:
    """`text` fed to a fresh tap in the pieces `cuts` make; after each, the tap and what it published."""
    tap = Tap(Call(f"run_{secrets.token_hex(6)}", 0, redactor))
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        tap.delta("text", text[a:b])
        yield tap, tap.shown["text"]
    published = sync_client().get(text_key(tap.call.run_id, tap.gen, "text")) if tap.call else None
    assert not tap.broken and (published or b"").decode() == tap.shown["text"]


def test_a_secret_split_across_pieces_at_every_offset_is_never_published() -> None:
    redactor = Redactor({"vault": SECRET}, patterns=True)
    text = f"{WORDS} the vault code is {SECRET} and then {WORDS} end"
    stored = redactor.text(text)
    assert SECRET not in stored
    start = text.index(SECRET)
    for offset in range(start - 2, start + len(SECRET) + 2):  # two pieces, cut at every offset in and around it
        for _, shown in stream(text, [offset], redactor):
            assert stored.startswith(shown), (offset, shown)
    for size in range(1, 9):  # many pieces of every size from 1 to 8, so each lands at every phase
        cuts = list(range(size, len(text), size))
        shown = ""
        for _, shown in stream(text, cuts, redactor):
            assert stored.startswith(shown), (size, shown)
        assert stored.startswith(shown) and len(shown) >= len(stored) - len("end")  # all but the last word


def test_a_pattern_key_far_behind_the_value_is_still_seen_by_the_window() -> None:
    """`Authorization:` then 300 spaces then `Bearer <token>`: the key is long before the value in
    characters, but the window keeps it (it counts non-whitespace characters)."""
    redactor = Redactor({}, patterns=True)
    text = f"{WORDS} {WORDS} Authorization:{' ' * 300}Bearer abcdefghijklmnop then {WORDS} end"
    stored = redactor.text(text)
    assert "abcdefghijklmnop" not in stored
    for size in (1, 3, 7):
        for _, shown in stream(text, list(range(size, len(text), size)), redactor):
            assert stored.startswith(shown)


def test_each_piece_redacts_a_bounded_window_not_the_reply_so_far() -> None:
    Measured.longest = 0
    redactor = Measured({"vault": SECRET}, patterns=True)
    text = " ".join(f"w{i:05d}" for i in range(3000)) + f" {SECRET} tail"  # 21,000 characters
    shown = list(stream(text, list(range(7, len(text), 7)), redactor))[-1][1]
    assert Measured.longest < 400, Measured.longest  # a window, not the 21,000-character reply
    stored = Redactor({"vault": SECRET}, patterns=True).text(text)
    assert stored.startswith(shown) and len(shown) > 20_000
