"""A `mock-script` step's thinking and text streamed in pieces (`chunk_chars`, `chunk_ms`), for the
live-token tests and bench (apps.runs.livetokens): each text piece's send time is appended to the
Redis list `lc:mock:sent:<run_id>` (a thinking piece's to `lc:mock:sent:<run_id>:thinking`) as
`"<unix time> <characters sent so far>"` (kept SENT_TTL_S), after one `"<unix time> 0"` when the
stream starts, so a test or the bench compares a client's arrival times against the mock's own
send times. The step's `thinking` is streamed before its text and replayed as the turn's thinking
block (Done.thinking), as a reasoning model's would be."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator

import redis
from redis import RedisError

from apps.core.redis import sync_client
from apps.gateway import waits
from apps.gateway.providers.base import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    TextDelta,
    ThinkingDelta,
)
from apps.gateway.providers.mock_script import Answer

log = logging.getLogger("loomcycle.gateway.mock")

SENT_TTL_S = 600


def sent_key(run_id: str, kind: str = "text") -> str:
    return f"lc:mock:sent:{run_id}" if kind == "text" else f"lc:mock:sent:{run_id}:{kind}"


def played(
    output: Iterable[ProviderEvent], answer: Answer, run_id: str, cancel: threading.Event, provider_id: str
) -> Iterator[ProviderEvent]:
    """The answer's events before its Done: its thinking first, then `output` (text and tool
    calls), the thinking and text in pieces when `answer.chunk_chars` is set."""
    if answer.thinking:
        if answer.chunk_chars:
            yield from chunked(answer.thinking, answer, run_id, cancel, provider_id, kind="thinking")
        else:
            yield ThinkingDelta(answer.thinking)
    for event in output:
        if isinstance(event, TextDelta) and answer.chunk_chars:
            yield from chunked(event.text, answer, run_id, cancel, provider_id)
        else:
            yield event


def with_thinking(done: ProviderEvent, answer: Answer) -> ProviderEvent:
    """`done` carrying the answer's thinking as the block a reasoning model's turn replays."""
    if not answer.thinking or not isinstance(done, Done):
        return done
    return dataclasses.replace(done, thinking=({"type": "thinking", "thinking": answer.thinking, "signature": ""},))


def chunked(
    text: str, answer: Answer, run_id: str, cancel: threading.Event, provider_id: str, *, kind: str = "text"
) -> Iterator[TextDelta | ThinkingDelta]:
    """`text` in pieces of `answer.chunk_chars` characters, `answer.chunk_s` apart (cancel-aware:
    a cancel cuts it there); broken (a retryable 500) after `answer.break_after` characters."""
    client = _client()
    sent, size = 0, answer.chunk_chars
    delta = ThinkingDelta if kind == "thinking" else TextDelta
    key = sent_key(run_id, kind)
    _record(client, key, 0)  # the stream's start: the first piece's time minus it is the mock's own TTFT
    for start in range(0, len(text), size):
        if answer.break_after and sent >= answer.break_after:
            raise ProviderError(provider_id, 500, "server_error (scripted broken stream)")
        if start and answer.chunk_s > 0:
            with waits.outside():
                if cancel.wait(answer.chunk_s):
                    raise ProviderCancelled()
        piece = text[start : start + size]
        sent += len(piece)
        _record(client, key, sent)
        yield delta(piece)


_CLIENT: tuple[int, redis.Redis] | None = None
_CLIENT_LOCK = threading.Lock()


def _client() -> redis.Redis:
    """One client per process (a client per call, opened and closed, hung a pool under load)."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None or _CLIENT[0] != os.getpid():
            _CLIENT = (os.getpid(), sync_client())
        return _CLIENT[1]


def _record(client: redis.Redis, key: str, sent: int) -> None:
    try:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(key, f"{time.time():.6f} {sent}")
        pipe.expire(key, SENT_TTL_S)
        pipe.execute()
    except (RedisError, OSError) as exc:  # the record is for tests and the bench; the reply goes on without it
        log.warning("mock: the send time of %s was not recorded (%s)", key, exc)
