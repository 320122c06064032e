"""A web process with the A2A server mounted, and the SDK's own client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest

from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from tests.conftest import daphne


@pytest.fixture(scope="module")
def a2a_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    with daphne(stack_env, logdir, "daphne-a2a", start_timeout=120, LOOMCYCLE_A2A_ENABLED="1") as base:
        yield base


async def sdk_client(base: str, headers: dict[str, str], *, streaming: bool = True) -> Client:
    """The SDK's client, from the runtime's card (fetched with the caller's token)."""
    http = httpx.AsyncClient(headers=headers, timeout=60)
    return await create_client(base, client_config=ClientConfig(streaming=streaming, httpx_client=http))


def user_message(text: str, *, skill: str | None = None, task_id: str = "", message_id: str = "m1") -> Message:
    message = Message(role=Role.ROLE_USER, message_id=message_id, task_id=task_id, parts=[Part(text=text)])
    if skill:
        message.metadata.update({"skillId": skill})
    return message


def send_request(message: Message, **configuration: Any) -> SendMessageRequest:
    request = SendMessageRequest(message=message)
    for key, value in configuration.items():
        setattr(request.configuration, key, value)
    return request


CARD = {
    "description": "acme's desk",
    "exposed_agents": [
        {"agent_name": "echo", "skill_id": "echo", "description": "answers ok"},
        {"agent_name": "asker", "skill_id": "asker"},
        {"agent_name": "very-slow", "skill_id": "slow"},
    ],
}


def expose(tenant_id: str = "acme", name: str = "desk", card: dict[str, Any] = CARD) -> None:
    author = substrate.Author(tenant_id=tenant_id, subject="test")
    substrate.def_create(get_kind("a2aservercard"), author, {"name": name, "overlay": card})
