"""An A2A server built with the SDK (DefaultRequestHandler, an AgentExecutor, the in-memory
task store, its JSON-RPC and card routes), served by uvicorn on a loopback port in a thread
of the test process: the remote agent this runtime's A2A tools call.

Skills (message.metadata.skillId): `answer` replies with what it heard and the bearer it was
sent; `stall` starts working and never answers until cancelled; `fail` fails the task."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.procs import free_port


@dataclass
class Seen:
    """What the peer was sent and did, for the test to assert on."""

    authorization: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)  # task ids of stalled calls
    cancelled: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class PeerExecutor(AgentExecutor):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        headers = context.call_context.state.get("headers", {})
        with self.seen.lock:
            self.seen.authorization.append(headers.get("authorization", ""))
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        skill = context.message.metadata["skillId"] if "skillId" in context.message.metadata else ""
        if skill == "answer":
            heard = f"peer heard {context.get_user_input()!r} with {headers.get('authorization', '')}"
            await updater.add_artifact([Part(text=heard)], name="answer")
            await updater.complete()
        elif skill == "fail":
            await updater.failed(updater.new_agent_message([Part(text="the peer broke: quota gone")]))
        else:
            await updater.start_work()
            with self.seen.lock:
                self.seen.stalled.append(task.id)
            await asyncio.Event().wait()  # never answers; cancel() ends it

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        with self.seen.lock:
            self.seen.cancelled.append(str(context.task_id))
        updater = TaskUpdater(event_queue, str(context.task_id), str(context.context_id))
        await updater.cancel()


def _card(url: str) -> AgentCard:
    return AgentCard(
        name="peer",
        description="a loopback test peer",
        version="1",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id=s, name=s, description=s, tags=[s]) for s in ("answer", "stall", "fail")],
    )


@contextmanager
def served(app: Any, port: int) -> Iterator[None]:
    """`app` on the loopback `port` (uvicorn in a thread) until the block ends."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="a2a-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # uvicorn's own flag: bound and accepting
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = server.force_exit = True
        thread.join(timeout=10)


@contextmanager
def serving() -> Iterator[tuple[str, Seen]]:
    """The peer at http://localhost:<port>/ until the block ends: (its URL, what it saw)."""
    port = free_port()
    url = f"http://localhost:{port}/"
    seen = Seen()
    card = _card(url)
    handler = DefaultRequestHandler(agent_executor=PeerExecutor(seen), task_store=InMemoryTaskStore(), agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    with served(app, port):
        yield url, seen


@dataclass
class Pushes:
    """What a push-notification receiver was sent: (headers, body) per POST."""

    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)


@contextmanager
def receiving() -> Iterator[tuple[str, Pushes]]:
    """A push-notification receiver at http://localhost:<port>/hook: (its URL, what it got)."""
    port = free_port()
    pushes = Pushes()

    async def hook(request: Request) -> Response:
        pushes.received.append((dict(request.headers), await request.json()))
        return Response(status_code=204)

    with served(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), port):
        yield f"http://localhost:{port}/hook", pushes
