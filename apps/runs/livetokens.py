"""Live text and thinking deltas: the worker's side (DESIGN.md, "live tokens").

The engine reads a provider stream in one place (apps.runs.engine.model `_consume`); for each
text or thinking delta it calls `Tap.delta`. Nothing
here touches Postgres: the step commit stays the one durable record of the reply (one `text`
event per model call). What goes live, per run, over Redis:

- `lc:live:<run_id>` (pub/sub): one JSON message per published piece,
  `{"s": step, "g": attempt id, "k": "text"|"thinking", "o": offset, "x": piece, "t": unix time}`,
  plus `"c": cause` when the attempt before it in this call was abandoned (`abandoned`: `retry`,
  `provider_fallback`), so a reader voids that attempt's text with the matching frame;
- `lc:live:<run_id>:cur` = `"<step> <attempt id> <cause>"`, and `lc:live:<run_id>:<attempt id>:<kind>` =
  everything published so far for that attempt (APPENDed), so a reader that connects in the middle
  of a call starts from what was produced so far (apps.runs.livemerge). Every key expires after
  LIVE_TTL_S: a call that is never committed leaves nothing behind.

Each model call attempt (a provider retry, a fallback, the same step re-run on another worker) gets
its own attempt id, so a reader sees that an attempt it showed was abandoned.

Redaction: what is published is the run's redactor (the one the step commit uses) applied to the
reply up to a safe cut, the end of the last whitespace run, where no Tier A value that holds
whitespace could straddle; a secret pattern's value never holds whitespace, so a piece never ends
inside one. So every published text is a prefix of the committed (redacted) text, and a secret the
model streams in pieces is shown masked or not at all. Each piece redacts only a window, not the
reply so far (that was quadratic in the reply's length): the raw text from an earlier safe cut
with at least LOOKBACK_NONSPACE non-whitespace characters (and the longest Tier A form) before the
last one, so a Tier B pattern whose key came before the new text (`Authorization: Bearer `, any
whitespace between) is inside it; the window's redaction is checked to repeat what was shown, and
where it does not (a value straddling the window's start) the whole reply is redacted, as before.
The last word is never published: the committed event brings it (so a one-word reply streams as
before, one committed `text`). A piece that would not extend what was published (cannot happen
with the rules above) stops this attempt's live output; the committed event carries the rest.

Publishing is fire and forget (PUBLISH never waits for subscribers; Redis drops a subscriber whose
buffer overflows), and a Redis error stops this attempt's live output: the run never waits on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis
from redis import RedisError

from apps.core.redact import Redactor, run_redactor
from apps.core.redis import async_client, sync_client

if TYPE_CHECKING:
    from redis import asyncio as aioredis

log = logging.getLogger("loomcycle.livetokens")

LIVE_TTL_S = 600
KINDS = ("text", "thinking")
# Non-whitespace characters a redaction window keeps before what it adds: more than the key part
# of any Tier B pattern holds (`authorization": "bearer` is 22), whatever whitespace sits inside it.
LOOKBACK_NONSPACE = 64


def live_channel(run_id: str) -> str:
    return f"lc:live:{run_id}"


def current_key(run_id: str) -> str:
    return f"lc:live:{run_id}:cur"


def text_key(run_id: str, gen: str, kind: str) -> str:
    return f"lc:live:{run_id}:{gen}:{kind}"


@dataclass
class Call:
    """The model call of one iteration (set by apps.runs.engine.model `call_model`): where its
    deltas go, how they are redacted, and its time to first token (the first attempt's)."""

    run_id: str
    step: int
    redactor: Redactor
    first_token_s: float | None = None
    cause: str = ""  # why the last attempt was abandoned (`abandoned`): the next one says it


def abandoned(cause: str) -> None:
    """The model call's attempt is given up and the call made again: `cause` is the frame that
    voids its live text for a reader (apps.runs.livemerge): `retry` or `provider_fallback`."""
    call = _CALL.get()
    if call is not None:
        call.cause = cause


_CALL: ContextVar[Call | None] = ContextVar("loomcycle_live_call", default=None)


@contextmanager
def calling(run_id: str, step: int, credentials: dict[str, str]) -> Iterator[Call]:
    """The iteration's model call: `_consume` inside it publishes (a compaction's call does not)."""
    call = Call(run_id, step, run_redactor(credentials))
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)


_CLIENT: tuple[int, redis.Redis] | None = None
_CLIENT_LOCK = threading.Lock()


def _client() -> redis.Redis:
    """One client (its own connection pool) per process: a delta must not open a connection."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None or _CLIENT[0] != os.getpid():
            _CLIENT = (os.getpid(), sync_client())
        return _CLIENT[1]


@dataclass
class Tap:
    """One attempt of a model call: raw deltas in, redacted pieces out to Redis."""

    call: Call | None
    started: float = field(default_factory=time.perf_counter)
    gen: str = field(default_factory=lambda: secrets.token_hex(6))
    cause: str = ""
    raw: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    shown: dict[str, str] = field(default_factory=lambda: dict.fromkeys(KINDS, ""))
    windows: dict[str, Window] = field(default_factory=lambda: {k: Window() for k in KINDS})
    announced: bool = False
    broken: bool = False

    def delta(self, kind: str, piece: str) -> None:
        """A delta from the provider stream: publish what of it is safe to show."""
        if self.call is not None and self.call.first_token_s is None:
            self.call.first_token_s = time.perf_counter() - self.started
        if self.call is None or self.broken or not piece:
            return
        self.raw[kind].append(piece)  # the whole reply, joined only when a window cannot decide
        self.windows[kind].text += piece
        self._publish(kind)

    def _publish(self, kind: str) -> None:
        assert self.call is not None
        redactor, win, before = self.call.redactor, self.windows[kind], self.shown[kind]
        start, shown_at_start = win.marks[0]
        cut = safe_cut(win.text, redactor)
        if start + cut <= win.marks[-1][0]:
            return
        shown = before[:shown_at_start] + redactor.text(win.text[:cut])
        if not shown.startswith(before):  # a value straddles the window's start: redact the whole reply
            shown = redactor.text("".join(self.raw[kind])[: start + cut])
        if len(shown) <= len(before):
            return
        if not shown.startswith(before):  # a redaction that rewrote what was shown: stop, the commit says the rest
            self.broken = True
            return
        self.shown[kind] = shown
        win.advance(start + cut, len(shown), max((len(f) for f in redactor.forms()), default=0))
        self._send(kind, len(before), shown[len(before) :])

    def _send(self, kind: str, offset: int, piece: str) -> None:
        assert self.call is not None
        run_id = self.call.run_id
        message = {"s": self.call.step, "g": self.gen, "k": kind, "o": offset, "x": piece, "t": time.time()}
        if self.cause:
            message["c"] = self.cause
        try:
            pipe = _client().pipeline(transaction=False)
            if not self.announced:
                pipe.set(current_key(run_id), f"{self.call.step} {self.gen} {self.cause}", ex=LIVE_TTL_S)
                for k in KINDS:
                    pipe.set(text_key(run_id, self.gen, k), "", ex=LIVE_TTL_S)
            pipe.append(text_key(run_id, self.gen, kind), piece)
            pipe.publish(live_channel(run_id), json.dumps(message, separators=(",", ":")))
            pipe.execute()
            self.announced = True
        except (RedisError, OSError) as exc:  # live output is best effort; the step commit is the record
            log.warning("live deltas of run %s stopped: %s", run_id, exc)
            self.broken = True


@dataclass
class Window:
    """One kind's redaction window: the raw reply from `marks[0]`'s raw offset on, and the safe cuts
    published since, as (raw offset, length of the text shown up to it)."""

    text: str = ""
    marks: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])

    def advance(self, raw_at: int, shown_len: int, longest_form: int) -> None:
        """A cut published: drop the marks the next window no longer needs (module docstring)."""
        self.marks.append((raw_at, shown_len))
        start = self.marks[0][0]
        while len(self.marks) > 2:
            kept = self.text[self.marks[1][0] - start : raw_at - start]
            if len(kept) < longest_form or len("".join(kept.split())) < LOOKBACK_NONSPACE:
                break
            self.marks.pop(0)
        self.text = self.text[self.marks[0][0] - start :]


def tap() -> Tap:
    """The tap of one provider stream read (`_consume`): inert outside `calling`."""
    call = _CALL.get()
    return Tap(call, cause=call.cause if call is not None else "")


def safe_cut(text: str, redactor: Redactor) -> int:
    """The end of `text`'s last whitespace run, or 0: where the shown text may stop now, so its
    redaction is a prefix of the whole reply's (module docstring)."""
    end = len(text)
    while end and not text[end - 1].isspace():
        end -= 1
    if not end:
        return 0
    head = text[:end]
    for form in redactor.forms():
        if any(c.isspace() for c in form) and any(head.endswith(form[:k]) for k in range(1, len(form))):
            return 0  # a value with whitespace may be starting: show nothing more until it is whole
    return end


@dataclass(frozen=True)
class Snapshot:
    """What Redis holds of the call in flight: its step, attempt id, and text so far per kind."""

    step: int
    gen: str
    texts: dict[str, str]
    cause: str = ""


_READERS: dict[int, aioredis.Redis] = {}


async def read_snapshot(run_id: str) -> Snapshot | None:
    """The call in flight's text so far (None: none, or Redis unreachable: the commit will do)."""
    loop_id = id(asyncio.get_running_loop())
    client = _READERS.get(loop_id)
    if client is None:
        client = _READERS[loop_id] = async_client()
    try:
        current = await client.get(current_key(run_id))
        if current is None:
            return None
        step, _, rest = _str(current).partition(" ")
        gen, _, cause = rest.partition(" ")
        texts = await client.mget([text_key(run_id, gen, k) for k in KINDS])
    except (RedisError, OSError) as exc:
        log.warning("live snapshot of run %s unavailable: %s", run_id, exc)
        return None
    return Snapshot(int(step), gen, {k: _str(t or b"") for k, t in zip(KINDS, texts, strict=True)}, cause)


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
