"""A2A requests held open while their task runs (`message/stream`, a blocking `message/send`,
`tasks/subscribe`) take one of the principal's stream slots, as SSE, WebSocket and gRPC streams
do: past LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL the request is refused before any run starts, and a
closed stream gives its slot back. On a web process of its own with a cap of 1."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from a2a.types import CancelTaskRequest
from a2a.utils.errors import A2AError

from apps.runs.models import Run
from apps.substrate import tokens
from tests.a2a.conftest import expose, sdk_client, send_request, user_message
from tests.conftest import daphne, wait_for

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(scope="module")
def capped_a2a_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    env = {"LOOMCYCLE_A2A_ENABLED": "1", "LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL": "1"}
    with daphne(stack_env, logdir, "daphne-a2a-capped", start_timeout=120, **env) as base:
        yield base


@pytest.fixture
def caller(people: dict[str, dict[str, str]]) -> dict[str, str]:
    """A subject no other test uses: slots are counted per (tenant, subject) in Redis."""
    subject = f"a2a-cap-{uuid.uuid4().hex[:8]}"
    token = tokens.token_create(name=subject, tenant_id="acme", subject=subject, scopes=["substrate:tenant"])
    return {"authorization": f"Bearer {token['token']}"}


def test_a_second_held_request_past_the_cap_is_refused_and_starts_no_run(
    capped_a2a_web: str, caller: dict[str, str]
) -> None:
    expose()

    async def scenario(count: Any) -> tuple[str, list[A2AError], int, int]:
        refused: list[A2AError] = []
        async with await sdk_client(capped_a2a_web, caller) as first:
            stream = first.send_message(send_request(user_message("take your time", skill="slow")))
            task_id = (await anext(stream)).task.id  # the task is out: the slot is held
            before = await asyncio.to_thread(count)
            async with await sdk_client(capped_a2a_web, caller, streaming=False) as second:
                request = send_request(user_message("hi", skill="echo", message_id="m2"))
                try:  # a blocking send would hold a second slot too
                    [r async for r in second.send_message(request)]
                except A2AError as exc:
                    refused.append(exc)
            after = await asyncio.to_thread(count)
            await stream.aclose()
        return task_id, refused, before, after

    task_id, refused, before, after = asyncio.run(scenario(Run.objects.count))
    assert [type(e).__name__ for e in refused] == ["InvalidRequestError"], refused
    assert "stream" in str(refused[0]) and before == after  # refused before any run started

    async def cancel() -> None:
        async with await sdk_client(capped_a2a_web, caller, streaming=False) as client:
            await client.cancel_task(CancelTaskRequest(id=task_id))

    async def send_again() -> Any:
        async with await sdk_client(capped_a2a_web, caller, streaming=False) as client:
            request = send_request(user_message("hi", skill="echo", message_id="m3"))
            return [r async for r in client.send_message(request)]

    asyncio.run(cancel())
    # The closed stream's slot comes back once the server has seen the hang-up.
    answered = wait_for(lambda: _or_none(send_again), timeout=30, interval=0.5)
    assert answered[0].task.id != task_id


def _or_none(send: Any) -> Any:
    try:
        return asyncio.run(send())
    except A2AError as exc:
        assert "stream" in str(exc), exc  # only the cap may refuse it
        return None
