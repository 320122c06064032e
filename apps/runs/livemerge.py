"""Live deltas merged into one connection's run stream (the reader's side of apps.runs.livetokens).

A connection emits the run's committed events (with their seq as `id:`) and, between them, the
live `text` / `thinking` pieces of the model call in flight (no `id:`, and `"live": true` in their
data: an EventSource keeps the last id for a frame without one, so the data says it). The rule a client relies
on (docs/api.md, "Live text"): concatenating the `text` frames of one connection gives the run's
text, no gap and no duplicate, whenever it connected. So, per connection:

- a live piece is emitted only for the call in flight: a step the stream has not seen committed
  (`floor`: the run's step read after its events), at the offset this connection has reached
  (a piece it already has is skipped, a gap sends the reader to the Redis snapshot);
- the committed `text` (or `thinking`) event that follows is emitted with only what the live
  pieces did not already show; the live pieces not yet confirmed this way are `pending`;
- pending pieces that the run will not keep (another attempt of the call started, the step
  committed without them, a committed text they are not a prefix of) are voided by an id-less
  frame named for the cause, with `"live": true` and `discarded_chars`: `provider_fallback`
  when the worker fell back to another candidate, `turn_cancelled` when a turn-cancel cut the
  call (its committed `turn_cancelled` event came with the step), else `retry` (a provider
  retry, the iteration re-run after its worker died or lost its lease), each with
  `{"reason": "live_text_discarded", ...}` under its usual key (`retry`, `fallback`,
  `turn_cancelled`): the client drops the text and thinking frames it has not had confirmed by a
  frame with an id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.runs.livetokens import KINDS, Snapshot

Out = tuple[str, dict[str, Any], int | None]  # event, data, seq (None: a live frame, no id)

VOID_REASON = "live_text_discarded"
# The frame that voids, by cause (apps.runs.livetokens `abandoned`), and the key of its details.
VOID_KEYS = {"retry": "retry", "provider_fallback": "fallback", "turn_cancelled": "turn_cancelled"}


@dataclass
class LiveMerge:
    floor: int = 0
    step: int = -1
    gen: str = ""
    pending: dict[str, str] = field(default_factory=lambda: dict.fromkeys(KINDS, ""))
    cut: bool = False  # a committed turn_cancelled since this attempt began: a void now is its doing

    def committed(self, row_type: str, payload: dict[str, Any], seq: int) -> Out:
        """A committed event, its text cut to what the live pieces did not show."""
        if row_type not in KINDS:
            self.cut = self.cut or row_type == "turn_cancelled"
            return row_type, payload, seq
        shown, self.pending[row_type] = self.pending[row_type], ""
        text = str(payload.get("text", ""))
        if shown and text.startswith(shown):
            return row_type, {**payload, "text": text[len(shown) :]}, seq
        return row_type, payload, seq

    def voided_before(self, row_type: str, payload: dict[str, Any]) -> list[Out]:
        """The void a committed text event needs first: pending pieces it does not begin with."""
        shown = self.pending.get(row_type, "")
        if row_type in KINDS and shown and not str(payload.get("text", "")).startswith(shown):
            return self._void("the committed text differs from the live text")
        return []

    def settle(self, floor: int) -> list[Out]:
        """After a page of committed events read before the run's step `floor`: pieces of a
        step below it that no committed event confirmed are void."""
        self.floor = max(self.floor, floor)
        if self.step < self.floor and any(self.pending.values()):
            return self._void("the model call ended without this text")
        return []

    def delta(self, message: dict[str, Any]) -> tuple[list[Out], bool]:
        """A live piece; False when the connection must re-read (a gap, or a step ahead of
        unconfirmed pieces): the caller reads Postgres, then the snapshot."""
        step, gen, kind, offset, piece = message["s"], message["g"], message["k"], message["o"], message["x"]
        if step < max(self.floor, self.step) or kind not in KINDS:  # committed, or a stale worker's
            return [], True
        out: list[Out] = []
        if (step, gen) != (self.step, self.gen):
            if step > self.step and any(self.pending.values()):
                return [], False
            out = self._switch(step, gen, str(message.get("c") or ""))
        have = len(self.pending[kind])
        if offset > have:
            return out, False
        rest = piece[have - offset :]
        if rest:
            self.pending[kind] += rest
            out.append((kind, {"type": kind, "text": rest, "live": True}, None))
        return out, True

    def snapshot(self, snap: Snapshot | None) -> list[Out]:
        """Catch up from Redis: what the call in flight produced that this connection lacks."""
        if snap is None or snap.step < max(self.floor, self.step):
            return []
        if snap.step > self.step and any(self.pending.values()):
            return []  # its step's commit comes first; the next re-read syncs again
        out: list[Out] = []
        if (snap.step, snap.gen) != (self.step, self.gen):
            out = self._switch(snap.step, snap.gen, snap.cause)
        for kind in KINDS:
            text, have = snap.texts.get(kind, ""), self.pending[kind]
            if not text.startswith(have):
                return [*out, *self._void("the live text was rewritten"), *self.snapshot(snap)]
            if len(text) > len(have):
                self.pending[kind] = text
                out.append((kind, {"type": kind, "text": text[len(have) :], "live": True}, None))
        return out

    def _switch(self, step: int, gen: str, cause: str) -> list[Out]:
        """A new attempt; `cause` is why the one before it was abandoned ("" from a new worker)."""
        out = self._void("the model call was made again", cause) if any(self.pending.values()) else []
        self.step, self.gen, self.cut = step, gen, False
        return out

    def _void(self, why: str, cause: str = "") -> list[Out]:
        discarded = {kind: len(text) for kind, text in self.pending.items()}
        self.pending = dict.fromkeys(KINDS, "")
        frame = cause if cause in VOID_KEYS else "turn_cancelled" if self.cut else "retry"
        details = {"reason": VOID_REASON, "message": why, "discarded_chars": discarded}
        # `error` says it again for a stream without ids or structured fields (gRPC's Event)
        error = f"live text discarded: drop the last {discarded['text']} characters of text"
        error += f" and {discarded['thinking']} of thinking shown since the last committed text"
        data = {"type": frame, VOID_KEYS[frame]: details, "discarded_chars": discarded, "error": error, "live": True}
        return [(frame, data, None)]
