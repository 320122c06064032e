"""Caps on open event streams (SSE and WebSocket): how many one principal may
hold at once, cluster-wide, and how long one may stay open.

A stream takes a slot in its principal's sorted set before its response
starts (429 `stream_limit_exceeded` when the principal is at
`LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL`) and holds it, refreshed by the
fairness heartbeat, until it ends. A slot taken but never held (the client
left before the stream started) and the slots of a web process that died
expire within the call-slot TTL. The lifetime cap
(`LOOMCYCLE_MAX_STREAM_SECONDS`) is checked at each frame or keepalive, so a
stream ends at most one keepalive interval after it; clients re-attach
gap-free from the last `seq` they saw.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from django.conf import settings

from apps.core.types import Principal
from apps.gateway.fairness import store
from apps.gateway.fairness.config import STREAM_KEY, Gate

LIFETIME_CLOSE = 4408  # WebSocket close code at the lifetime cap (4000 + 408, as auth failures use 4000 + status)


@dataclass(frozen=True)
class StreamSlot:
    gates: list[Gate] = field(default_factory=list)
    member: str = ""
    deadline: float | None = None  # time.monotonic() past which the stream ends

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Keep the slot for the stream's life and give it back when it ends."""
        if not self.gates:
            yield
            return
        async with store.aheld(self.gates, self.member):
            yield

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Keep the slot alive (heartbeat) while the request waits before its
        stream starts (a streaming run waiting for its admission slot)."""
        if self.gates:
            store.HEARTBEAT.hold(self.member, [g.key for g in self.gates])
        try:
            yield
        finally:
            if self.gates:
                store.HEARTBEAT.drop(self.member)  # `held` takes over, or `release` gives it back

    async def release(self) -> None:
        """Give back a slot the stream will never hold (its run was not created)."""
        if self.gates:
            await store.arelease(self.gates, self.member)


def stream_gate(principal: Principal) -> Gate | None:
    cap = settings.LOOMCYCLE.max_streams_per_principal
    who = f"{principal.tenant_id}/{principal.subject}"
    return Gate(STREAM_KEY + who, cap, "stream", who) if cap > 0 else None


async def astream_slot(principal: Principal) -> StreamSlot:
    """Take a stream slot for `principal` (429 `stream_limit_exceeded` when full)."""
    seconds = settings.LOOMCYCLE.max_stream_seconds
    deadline = time.monotonic() + seconds if seconds > 0 else None
    gate = stream_gate(principal)
    if gate is None:
        return StreamSlot(deadline=deadline)
    member = f"s_{secrets.token_hex(8)}"
    if (full := await store.atake([gate], member, store.CALL_TTL_MS)) is not None:
        raise full.refused()
    return StreamSlot([gate], member, deadline)
