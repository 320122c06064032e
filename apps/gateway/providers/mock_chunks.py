"""A `mock-script` step's text streamed in pieces (`chunk_chars`, `chunk_ms`), for the live-token
tests and bench (apps.runs.livetokens): each piece's send time is appended to the Redis list
`lc:mock:sent:<run_id>` as `"<unix time> <characters sent so far>"` (kept SENT_TTL_S), after one
`"<unix time> 0"` when the stream starts, so a test or the bench compares a client's arrival times
against the mock's own send times."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import redis
from redis import RedisError

from apps.core.redis import sync_client
from apps.gateway import waits
from apps.gateway.providers.base import ProviderCancelled, ProviderError, TextDelta
from apps.gateway.providers.mock_script import Answer

SENT_TTL_S = 600


def sent_key(run_id: str) -> str:
    return f"lc:mock:sent:{run_id}"


def chunked(text: str, answer: Answer, run_id: str, cancel: threading.Event, provider_id: str) -> Iterator[TextDelta]:
    """`text` in pieces of `answer.chunk_chars` characters, `answer.chunk_s` apart (cancel-aware:
    a cancel cuts it there); broken (a retryable 500) after `answer.break_after` characters."""
    client = _client()
    sent, size = 0, answer.chunk_chars
    _record(client, run_id, 0)  # the stream's start: the first piece's time minus it is the mock's own TTFT
    for start in range(0, len(text), size):
        if answer.break_after and sent >= answer.break_after:
            raise ProviderError(provider_id, 500, "server_error (scripted broken stream)")
        if start and answer.chunk_s > 0:
            with waits.outside():
                if cancel.wait(answer.chunk_s):
                    raise ProviderCancelled()
        piece = text[start : start + size]
        sent += len(piece)
        _record(client, run_id, sent)
        yield TextDelta(piece)


_CLIENT: tuple[int, redis.Redis] | None = None
_CLIENT_LOCK = threading.Lock()


def _client() -> redis.Redis:
    """One client per process (a client per call, opened and closed, hung a pool under load)."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None or _CLIENT[0] != os.getpid():
            _CLIENT = (os.getpid(), sync_client())
        return _CLIENT[1]


def _record(client: redis.Redis, run_id: str, sent: int) -> None:
    try:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(sent_key(run_id), f"{time.time():.6f} {sent}")
        pipe.expire(sent_key(run_id), SENT_TTL_S)
        pipe.execute()
    except (RedisError, OSError):  # the record is for tests and the bench; the reply goes on without it
        pass
