"""WebSocket `/ws/runs/{run_id}/?from_seq=N`: the SSE stream's contract over WS.

Each message is `{"seq": N|null, "event": "<type>", "data": {...}}`; the
socket closes (1000) once the run is terminal and drained. Unknown or
another tenant's run closes with 4404, bad credentials with 4401, a token
without runs:read with 4403, a principal at its stream cap with 4429, and a
socket open for LOOMCYCLE_MAX_STREAM_SECONDS with 4408 (re-attach with
`from_seq`).

Without a bearer, the Django admin's session cookie of a staff user with
`runs.view_run` also opens it (the run console's live tail), on a
same-origin handshake only (apps.substrate.sessionauth).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import connection

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident
from apps.core.numbers import parse_count
from apps.gateway.fairness.streams import LIFETIME_CLOSE, StreamSlot, astream_slot
from apps.runs.selectors import run_get
from apps.runs.streams import KEEPALIVE, keepalive_seconds, run_frames
from apps.substrate.auth import aauthenticate_for, bearer_from_headers
from apps.substrate.sessionauth import session_principal

# What a Django admin session needs to tail a run (the run console's view permission).
CONSOLE_PERMISSION = "runs.view_run"


def _owned_run_id(tenant_id: str | None, owner: str | None, run_id: str) -> str:
    try:
        return run_get(tenant_id=tenant_id, run_id=run_id, owner=owner).id
    finally:
        connection.close()


class RunStreamConsumer(AsyncWebsocketConsumer):
    task: asyncio.Task[None] | None = None
    slot: StreamSlot = StreamSlot()

    async def connect(self) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in self.scope.get("headers", [])}
        client = self.scope.get("client") or (None, None)
        run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        from_seq_raw = (query.get("from_seq") or ["0"])[-1]
        protos = [p for p in self.scope.get("subprotocols", []) if p.startswith("bearer.")]
        # Accept first, then close with a code: a close before accept becomes a
        # bare HTTP 403 handshake rejection and clients never see the reason.
        await self.accept(subprotocol=protos[0] if protos else None)
        try:
            token = bearer_from_headers(headers)
            principal = None
            if token is None and "cookie" in headers:  # the run console's live tail (apps.substrate.sessionauth)
                principal = await sync_to_async(session_principal, thread_sensitive=False)(
                    headers, permission=CONSOLE_PERMISSION
                )
            if principal is None:
                principal = await aauthenticate_for(token, client[0], "GET", str(self.scope.get("path", "")))
            from_seq = parse_count(from_seq_raw)
            if not is_ident(run_id) or from_seq is None:
                await self.close(code=4400)
                return
            run_id = await sync_to_async(_owned_run_id, thread_sensitive=False)(
                principal.read_tenant, principal.read_user, run_id
            )
            self.slot = await astream_slot(principal)
        except ApplicationError as exc:
            await self.close(code=4000 + exc.status)
            return
        self.task = asyncio.get_running_loop().create_task(self._pump(run_id, from_seq))

    async def _pump(self, run_id: str, from_seq: int) -> None:
        async with self.slot.held(), aclosing(run_frames(run_id, from_seq, keepalive_seconds())) as frames:
            async for frame in frames:
                if frame is KEEPALIVE:
                    message: dict[str, Any] = {"seq": None, "event": "keepalive", "data": {}}
                else:
                    message = {"seq": frame.seq, "event": frame.event, "data": frame.data}
                await self.send(text_data=json.dumps(message, separators=(",", ":")))
                if self.slot.expired():
                    await self.close(code=LIFETIME_CLOSE)
                    return
        await self.close(code=1000)

    async def disconnect(self, code: int) -> None:
        if self.task is not None:
            self.task.cancel()
