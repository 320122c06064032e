"""One exchange with a remote A2A agent, through the SDK's client over the SSRF guard.

Every URL (the card's, the endpoint's, and the endpoint a fetched card names) is dialled
through apps.core.egress with the calling run's host policy, so a peer or its card cannot
point the runtime at a private address. The run's credential named by the peer's
`auth.bearer_credential_ref` rides in the Authorization header and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from a2a.utils.errors import A2AError

from apps.core import egress
from apps.substrate.models import VersionedDef

log = logging.getLogger("loomcycle.a2a")

CALL_TIMEOUT_S = 30.0  # one HTTP exchange (a card, a send, a get); the stream itself is bounded by the caller
SETTLED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
        TaskState.TASK_STATE_INPUT_REQUIRED,
        TaskState.TASK_STATE_AUTH_REQUIRED,
    }
)


class PeerFailed(Exception):
    """The peer, its card or the network failed: the tool's is_error text."""


@dataclass(frozen=True)
class Peer:
    name: str
    def_id: str
    endpoint: str
    card_url: str
    bearer_ref: str

    @classmethod
    def of(cls, row: VersionedDef) -> Peer:
        d = row.definition
        return cls(
            name=row.name,
            def_id=row.id,
            endpoint=str(d.get("endpoint") or ""),
            card_url=str(d.get("agent_card_url") or ""),
            bearer_ref=str((d.get("auth") or {}).get("bearer_credential_ref") or ""),
        )


@dataclass
class Progress:
    """What the peer has said of the task so far."""

    task_id: str = ""
    state: int = TaskState.TASK_STATE_UNSPECIFIED
    chunks: list[str] = field(default_factory=list)
    status_text: str = ""

    @property
    def settled(self) -> bool:
        return self.state in SETTLED

    @property
    def text(self) -> str:
        return "".join(self.chunks) or self.status_text

    def apply_task(self, task: Task) -> None:
        self.task_id, self.state = task.id or self.task_id, task.status.state
        self.status_text = _texts(task.status.message.parts) or self.status_text
        if task.artifacts:
            self.chunks = [_texts(a.parts) for a in task.artifacts]

    def apply(self, response: StreamResponse) -> None:
        kind = response.WhichOneof("payload")
        if kind == "task":
            self.apply_task(response.task)
        elif kind == "message":
            self.chunks.append(_texts(response.message.parts))
            self.state = TaskState.TASK_STATE_COMPLETED  # a direct reply: there is no task to follow
        elif kind == "status_update":
            self.task_id = response.status_update.task_id or self.task_id
            self.state = response.status_update.status.state
            self.status_text = _texts(response.status_update.status.message.parts) or self.status_text
        elif kind == "artifact_update":
            update = response.artifact_update
            text = _texts(update.artifact.parts)
            self.chunks = [*self.chunks, text] if update.append else [text]


def _texts(parts: Any) -> str:
    return "".join(p.text for p in parts if p.WhichOneof("content") == "text")


def _endpoint_card(url: str) -> AgentCard:
    """The card of a peer given by endpoint: JSON-RPC there, streaming assumed (a peer that
    does not stream answers message/stream with an error the tool reports)."""
    interface = AgentInterface(
        url=url, protocol_binding=TransportProtocol.JSONRPC.value, protocol_version=PROTOCOL_VERSION_CURRENT
    )
    return AgentCard(name="peer", supported_interfaces=[interface], capabilities=AgentCapabilities(streaming=True))


@asynccontextmanager
async def connected(peer: Peer, bearer: str, policy: egress.HostPolicy) -> AsyncIterator[Client]:
    headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
    async with egress.async_client(policy=policy, timeout=CALL_TIMEOUT_S, headers=headers) as http:
        try:
            if peer.endpoint:
                card = _endpoint_card(peer.endpoint)
            else:
                parts = urlsplit(peer.card_url)
                resolver = A2ACardResolver(http, f"{parts.scheme}://{parts.netloc}")
                card = await resolver.get_agent_card(relative_card_path=parts.path)
            client = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        except (A2AError, httpx.HTTPError, egress.EgressRefused, ValueError) as exc:
            raise PeerFailed(_reason(exc)) from exc
        async with client:
            yield client


def _reason(exc: BaseException) -> str:
    if isinstance(exc, egress.EgressRefused):
        return exc.reason
    cause = exc.__cause__
    return f"{type(exc).__name__}: {exc}" + (f" ({cause})" if cause and str(cause) not in str(exc) else "")


def message(text: str, skill: str | None) -> SendMessageRequest:
    msg = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
    if skill:
        msg.metadata.update({"skillId": skill})
    return SendMessageRequest(message=msg)


async def _follow(client: Client, request: SendMessageRequest, progress: Progress) -> None:
    async for response in client.send_message(request):
        progress.apply(response)
        if progress.settled:
            return


async def send(
    peer: Peer,
    bearer: str,
    policy: egress.HostPolicy,
    request: SendMessageRequest,
    *,
    window_s: float,
    cancelled: threading.Event,
) -> tuple[Progress, bool]:
    """Stream the message for up to `window_s`: (what the peer said, whether the run was
    cancelled meanwhile). Raises PeerFailed."""
    progress = Progress()
    async with connected(peer, bearer, policy) as client:
        follow = asyncio.ensure_future(_follow(client, request, progress))
        cancel = asyncio.ensure_future(asyncio.to_thread(cancelled.wait, window_s))
        try:
            await asyncio.wait({follow, cancel}, timeout=window_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            follow.cancel()
        if follow.done() and not follow.cancelled() and follow.exception() is not None:
            raise PeerFailed(_reason(follow.exception()))  # type: ignore[arg-type]
        was_cancelled = cancelled.is_set()
        if was_cancelled and progress.task_id and not progress.settled:
            await _cancel_quietly(client, progress.task_id)
        return progress, was_cancelled


async def get(peer: Peer, bearer: str, policy: egress.HostPolicy, task_id: str) -> Progress:
    progress = Progress(task_id=task_id)
    async with connected(peer, bearer, policy) as client:
        try:
            progress.apply_task(await client.get_task(GetTaskRequest(id=task_id)))
        except (A2AError, httpx.HTTPError, egress.EgressRefused) as exc:
            raise PeerFailed(_reason(exc)) from exc
    return progress


async def cancel(peer: Peer, bearer: str, policy: egress.HostPolicy, task_id: str) -> None:
    async with connected(peer, bearer, policy) as client:
        await _cancel_quietly(client, task_id)


async def _cancel_quietly(client: Client, task_id: str) -> None:
    """Best effort: the peer may have ended the task, or not support cancel."""
    try:
        await client.cancel_task(CancelTaskRequest(id=task_id))
    except (A2AError, httpx.HTTPError, egress.EgressRefused) as exc:
        log.info("A2A peer did not take the cancel of task %s: %s", task_id, _reason(exc))
