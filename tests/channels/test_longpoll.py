"""`longpoll.subscribe_waiting`, the one subscribe-that-waits REST, the MCP server and gRPC
call: it answers at once when there is something to read (committing the cursor), wakes on a
publish while it waits, answers an empty read when the wait is over, and refuses a bad cursor."""

from __future__ import annotations

import asyncio
import time

import pytest

from apps.channels import selectors, services
from apps.channels.errors import InvalidCursor
from apps.channels.longpoll import subscribe_waiting
from apps.channels.streams import Read, Stream

pytestmark = pytest.mark.usefixtures("agents")

HANDOFF = Stream("", "handoff", "global", "")  # a yaml channel (tests' loomcycle.yaml)


def _publish(value: object) -> None:
    declared = selectors.channel_get(tenant_id="", name="handoff")
    services.publish(stream=HANDOFF, declared=declared, value=value, published_by="_test")


def _subscribe(wait_ms: int | None, from_cursor: str | None = None) -> Read:
    return asyncio.run(subscribe_waiting(stream=HANDOFF, from_cursor=from_cursor, max_messages=None, wait_ms=wait_ms))


def test_what_is_there_is_answered_at_once_and_the_cursor_committed() -> None:
    _publish(1)
    _publish(2)
    assert [m["value"] for m in _subscribe(wait_ms=10_000).messages] == [1, 2]
    assert _subscribe(wait_ms=0).messages == []  # the first read committed past both


def test_a_publish_wakes_the_wait() -> None:
    async def both() -> Read:
        waiting = asyncio.create_task(
            subscribe_waiting(stream=HANDOFF, from_cursor=None, max_messages=None, wait_ms=20_000)
        )
        await asyncio.to_thread(_publish, "late")
        return await waiting

    started = time.monotonic()
    read = asyncio.run(both())
    assert [m["value"] for m in read.messages] == ["late"]
    assert time.monotonic() - started < 10  # woken by the publish, long before the 20 s wait ends


def test_the_end_of_the_wait_is_an_empty_read_not_an_error() -> None:
    read = _subscribe(wait_ms=300)
    assert read.messages == [] and read.next_cursor == ""


def test_a_bad_cursor_is_refused() -> None:
    with pytest.raises(InvalidCursor):
        _subscribe(wait_ms=0, from_cursor="cur_zz")
