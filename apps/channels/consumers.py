"""WebSocket `/ws/channels/{name}/?from_cursor=&user_id=`: a live, read-only
view of one channel stream.

- The stream is the one the REST routes reach: a global/tenant channel in the
  caller's tenant, or with `user_id` the user's stream of a scope=user channel
  (an isolated principal may name only its own user id, and must name it: the
  tenant stream is refused to it, 4403, as REST refuses it). Agent-scoped
  channels are not served here.
- Without `from_cursor` only messages that become visible after the handshake
  are sent: the start position (the newest visible message) and the doorbell
  subscription are both taken before the socket is accepted. With
  `from_cursor` (`cur_0` or "" = from the oldest) the stream replays what
  follows that cursor first.
- Each message is `{"channel","id","value","published_at","cursor"}`, where
  `cursor` is that message's own cursor (resume with `?from_cursor=<it>`).
  Reads are peeks: the socket NEVER commits the stream's cursor.
- New messages are read on every publish doorbell and at least every second
  (a deferred message becomes visible without a ring).
- Close codes: 4400 bad request (cursor, user id, channel scope), 4401 bad
  credentials, 4403 missing channel:read (or an isolated principal without
  `user_id`), 4404 unknown channel (or another
  user's stream for an isolated principal), 4429 when the principal holds
  LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL streams already, 4408 when the socket
  has been open for LOOMCYCLE_MAX_STREAM_SECONDS (re-attach with the last
  cursor), 1011 when reading fails.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from apps.channels import access, presenters, selectors, streams
from apps.channels.streams import Read, Stream, check_cursor
from apps.core.errors import ApplicationError
from apps.core.http import db_call
from apps.core.pubsub import hub
from apps.core.types import Principal
from apps.gateway.fairness.streams import LIFETIME_CLOSE, StreamSlot, astream_slot
from apps.substrate.auth import aauthenticate_for, bearer_from_headers

log = logging.getLogger("loomcycle.channels.ws")

PAGE = selectors.MAX_MESSAGES_CAP
REPOLL_S = 1.0


def _resolve(principal: Principal, name: str, user_id: str | None, from_cursor: str | None) -> tuple[Stream, str]:
    """The stream and the cursor to read after."""
    if user_id is not None:
        stream = access.user_stream(principal, user_id, name)[0]
    else:
        stream = access.admin_stream(principal, name)[0]
    return stream, from_cursor if from_cursor is not None else selectors.newest_cursor(stream)


def _peek(stream: Stream, after: str) -> Read:
    return selectors.peek(stream=stream, from_cursor=after, max_messages=PAGE)


class ChannelStreamConsumer(AsyncWebsocketConsumer):
    task: asyncio.Task[None] | None = None
    slot: StreamSlot = StreamSlot()
    bell: str = ""
    wake: asyncio.Queue[str] | None = None

    async def connect(self) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in self.scope.get("headers", [])}
        client = self.scope.get("client") or (None, None)
        name = str(self.scope["url_route"]["kwargs"]["name"])
        query = parse_qs(self.scope.get("query_string", b"").decode(), keep_blank_values=True)
        protos = [p for p in self.scope.get("subprotocols", []) if p.startswith("bearer.")]
        failed: int | None = None
        start = ""
        stream: Stream | None = None
        try:
            token = bearer_from_headers(headers)
            principal = await aauthenticate_for(token, client[0], "GET", str(self.scope.get("path", "")))
            from_cursor = check_cursor((query.get("from_cursor") or [None])[-1])
            user_id = (query.get("user_id") or [None])[-1]
            # Ring first, position second: nothing published after the handshake is missed.
            stream, start = await self._subscribe_then_resolve(principal, name, user_id, from_cursor)
            self.slot = await astream_slot(principal)
        except ApplicationError as exc:
            failed = 4000 + exc.status
        # Accept, then close with a code: a close before accept becomes a bare
        # HTTP 403 handshake rejection and clients never see the reason.
        await self.accept(subprotocol=protos[0] if protos else None)
        if failed is not None or stream is None:
            await self.close(code=failed or 4400)
            return
        self.task = asyncio.get_running_loop().create_task(self._pump(stream, start))

    async def _subscribe_then_resolve(
        self, principal: Principal, name: str, user_id: str | None, from_cursor: str | None
    ) -> tuple[Stream, str]:
        tenant = principal.tenant_id
        self.bell = streams.bell(tenant, name)
        self.wake = await hub().subscribe(self.bell)
        try:
            return await db_call(_resolve)(principal, name, user_id, from_cursor)
        except BaseException:
            await self._release()
            raise

    async def _pump(self, stream: Stream, after: str) -> None:
        async with self.slot.held():
            await self._pump_held(stream, after)

    async def _pump_held(self, stream: Stream, after: str) -> None:
        read = db_call(_peek)
        wake = self.wake
        try:
            while not self.slot.expired():
                page = await read(stream, after)
                for message, cursor in zip(page.messages, page.cursors, strict=True):
                    await self.send(text_data=presenters.stream_frame(stream, message, cursor))
                    after = cursor
                if len(page.messages) == PAGE:
                    continue
                if wake is None:
                    await asyncio.sleep(REPOLL_S)
                    continue
                try:
                    await asyncio.wait_for(wake.get(), timeout=REPOLL_S)
                except TimeoutError:
                    continue
                while not wake.empty():
                    wake.get_nowait()
        except DatabaseError:
            log.exception("channel stream %s: reading failed; closing the socket", stream.channel)
            await self.close(code=1011)
            return
        await self.close(code=LIFETIME_CLOSE)

    async def _release(self) -> None:
        wake, self.wake = self.wake, None
        if wake is not None:
            await hub().unsubscribe(self.bell, wake)

    async def disconnect(self, code: int) -> None:
        if self.task is not None:
            self.task.cancel()
        await self._release()
