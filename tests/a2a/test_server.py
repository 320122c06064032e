"""The SDK's own client against this runtime's A2A server: a task is a run (send, stream,
get, cancel), its state follows the run's (input-required while an Interruption.ask waits,
answered by the next message), and another tenant's token neither sees nor cancels it.

Against a real web process (Daphne, LOOMCYCLE_A2A_ENABLED=1), workers, Postgres and Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError, InvalidParamsError, PushNotificationNotSupportedError, TaskNotFoundError

from apps.runs.models import Run, RunStatus
from tests.a2a import peer
from tests.a2a.conftest import CARD, expose, sdk_client, send_request, user_message
from tests.conftest import wait_for, wait_status
from tests.factories.runs import ASK

pytestmark = pytest.mark.usefixtures("agents", "stack")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _send(base: str, headers: dict[str, str], text: str, skill: str, *, streaming: bool) -> list[StreamResponse]:
    client = await sdk_client(base, headers, streaming=streaming)
    async with client:
        return [r async for r in client.send_message(send_request(user_message(text, skill=skill)))]


def test_cards_list_the_callers_exposed_agents_and_nobody_elses(
    a2a_web: str, people: dict[str, dict[str, str]]
) -> None:
    expose()
    alice = httpx.get(f"{a2a_web}/.well-known/agent-card.json", headers=people["alice"]).json()
    assert sorted(s["id"] for s in alice["skills"]) == ["asker", "echo", "slow"]
    assert alice["supportedInterfaces"][0]["url"] == f"{a2a_web}/a2a/jsonrpc"
    charlie = httpx.get(f"{a2a_web}/.well-known/agent-card.json", headers=people["charlie"]).json()
    anonymous = httpx.get(f"{a2a_web}/.well-known/agent-card.json").json()
    assert charlie.get("skills", []) == [] and anonymous.get("skills", []) == []
    one = httpx.get(f"{a2a_web}/a2a/agents/echo/.well-known/agent-card.json", headers=people["alice"]).json()
    assert one["supportedInterfaces"][0]["url"] == f"{a2a_web}/a2a/agents/echo/jsonrpc"
    assert [s["id"] for s in one["skills"]] == ["echo"]
    hidden = httpx.get(f"{a2a_web}/a2a/agents/echo/.well-known/agent-card.json", headers=people["charlie"])
    assert hidden.status_code == 404 and hidden.json()["code"] == "not_found"


def test_message_send_is_a_run_and_returns_its_completed_task(a2a_web: str, people: dict[str, dict[str, str]]) -> None:
    expose()
    (response,) = run(_send(a2a_web, people["alice"], "hello", "echo", streaming=False))
    task = response.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    row = Run.objects.get(id=task.id)
    assert (row.tenant_id, row.agent_name, row.status, row.session_id) == ("acme", "echo", "completed", task.context_id)
    assert row.metadata["a2a"]["skill_id"] == "echo"
    assert task.artifacts[0].parts[0].text and task.artifacts[0].parts[0].text in task.status.message.parts[0].text


def test_message_stream_sends_the_task_its_text_and_its_end(a2a_web: str, people: dict[str, dict[str, str]]) -> None:
    expose()
    responses = run(_send(a2a_web, people["alice"], "hello", "echo", streaming=True))
    kinds = [r.WhichOneof("payload") for r in responses]
    assert kinds[0] == "task" and "artifact_update" in kinds
    last = responses[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_COMPLETED
    streamed = "".join(r.artifact_update.artifact.parts[0].text for r in responses if r.HasField("artifact_update"))
    assert streamed == last.status.message.parts[0].text  # the text as it came is the text the run ended with


def test_get_and_cancel_follow_the_run_and_another_tenant_sees_neither(
    a2a_web: str, people: dict[str, dict[str, str]]
) -> None:
    expose()

    async def start() -> Any:
        async with await sdk_client(a2a_web, people["alice"], streaming=False) as alice:
            request = send_request(user_message("take your time", skill="slow"), return_immediately=True)
            (first,) = [r async for r in alice.send_message(request)]
            return first.task

    async def probe(task_id: str) -> tuple[Any, list[A2AError]]:
        refused: list[A2AError] = []
        async with (
            await sdk_client(a2a_web, people["alice"]) as alice,
            await sdk_client(a2a_web, people["charlie"]) as charlie,
        ):
            seen = await alice.get_task(GetTaskRequest(id=task_id))
            for call in (
                charlie.get_task(GetTaskRequest(id=task_id)),
                charlie.cancel_task(CancelTaskRequest(id=task_id)),
            ):
                try:
                    await call
                except A2AError as exc:
                    refused.append(exc)
        return seen, refused

    async def cancel(task_id: str) -> Any:
        async with await sdk_client(a2a_web, people["alice"]) as alice:
            return await alice.cancel_task(CancelTaskRequest(id=task_id))

    first = run(start())
    assert first.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)  # not waited for
    wait_status(first.id, RunStatus.RUNNING, timeout=30)
    seen, refused = run(probe(first.id))
    assert seen.status.state == TaskState.TASK_STATE_WORKING and seen.id == first.id
    # Exactly what a task that does not exist answers (TaskNotFoundError, -32001).
    assert [type(e) for e in refused] == [TaskNotFoundError, TaskNotFoundError], refused
    assert Run.objects.get(id=first.id).status == RunStatus.RUNNING  # charlie's cancel did nothing
    cancelled = run(cancel(first.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert wait_status(first.id, RunStatus.CANCELLED).cancel_reason == "cancelled over A2A"


def test_subscribe_follows_a_running_task_to_its_end(a2a_web: str, people: dict[str, dict[str, str]]) -> None:
    expose()

    async def start() -> Any:
        async with await sdk_client(a2a_web, people["alice"], streaming=False) as alice:
            request = send_request(user_message("take your time", skill="slow"), return_immediately=True)
            (first,) = [r async for r in alice.send_message(request)]
            return first.task

    async def follow_and_cancel(task_id: str) -> list[StreamResponse]:
        async with (
            await sdk_client(a2a_web, people["alice"]) as follower,
            await sdk_client(a2a_web, people["alice"]) as canceller,
        ):
            seen: list[StreamResponse] = []
            subscribed = asyncio.Event()

            async def follow() -> None:
                async for response in follower.subscribe(SubscribeToTaskRequest(id=task_id)):
                    seen.append(response)
                    subscribed.set()

            following = asyncio.ensure_future(follow())
            await asyncio.wait_for(subscribed.wait(), timeout=60)  # the task came: the stream is open
            await canceller.cancel_task(CancelTaskRequest(id=task_id))
            await asyncio.wait_for(following, timeout=60)
            return seen

    task = run(start())
    wait_status(task.id, RunStatus.RUNNING, timeout=30)
    seen = run(follow_and_cancel(task.id))
    assert seen[0].task.id == task.id
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED


def test_an_ask_is_input_required_and_the_next_message_answers_it(
    a2a_web: str, people: dict[str, dict[str, str]]
) -> None:
    expose()
    script = "MOCK_SCRIPT: " + json.dumps([{"tools": [{"tool": "Interruption", "input": ASK}]}, {"text": "done"}])

    async def scenario() -> tuple[Any, Any]:
        client = await sdk_client(a2a_web, people["alice"], streaming=False)
        async with client:
            (asked,) = [r async for r in client.send_message(send_request(user_message(script, skill="asker")))]
            answer = user_message("yes", task_id=asked.task.id, message_id="m2")
            (done,) = [r async for r in client.send_message(send_request(answer))]
            return asked.task, done.task

    asked, done = run(scenario())
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert asked.status.message.parts[0].text == ASK["question"]
    assert done.id == asked.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    assert done.artifacts[0].parts[0].text == "done"


def test_v0_3_method_names_reach_the_same_handler(a2a_web: str, people: dict[str, dict[str, str]]) -> None:
    expose()
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m1",
                "role": "user",
                "parts": [{"kind": "text", "text": "hi"}],
                "metadata": {"skillId": "echo"},
            }
        },
    }
    resp = httpx.post(f"{a2a_web}/a2a/jsonrpc", json=body, headers=people["alice"], timeout=60)
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    assert result["kind"] == "task" and result["status"]["state"] == "completed"


def test_calls_without_a_token_or_with_a_bad_skill_are_refused(a2a_web: str, people: dict[str, dict[str, str]]) -> None:
    expose()
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "r_0000000000000000"}}
    assert httpx.post(f"{a2a_web}/a2a/jsonrpc", json=body).status_code == 401
    with pytest.raises(InvalidParamsError, match="unknown skill"):
        run(_send(a2a_web, people["alice"], "hello", "nope", streaming=False))


def test_push_configs_are_the_sdks_and_the_ended_task_is_posted_once_through_the_guard(
    a2a_web: str, people: dict[str, dict[str, str]]
) -> None:
    expose(card={**CARD, "capabilities": {"push_notifications": True}})
    with peer.receiving() as (hook, pushes):

        async def scenario() -> tuple[Any, Any, Any]:
            async with await sdk_client(a2a_web, people["alice"], streaming=False) as alice:
                request = send_request(user_message("take your time", skill="slow"), return_immediately=True)
                (first,) = [r async for r in alice.send_message(request)]
                config = TaskPushNotificationConfig(task_id=first.task.id, id="c1", url=hook, token="tok-1")
                config.authentication.scheme, config.authentication.credentials = "Bearer", "hook-secret"
                created = await alice.create_task_push_notification_config(config)
                listed = await alice.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=first.task.id)
                )
                await alice.cancel_task(CancelTaskRequest(id=first.task.id))
                return first.task, created, listed

        task, created, listed = run(scenario())
        assert (created.id, created.url, created.token) == ("c1", hook, "tok-1")
        assert [c.id for c in listed.configs] == ["c1"]
        assert listed.configs[0].authentication.credentials == ""  # never read back
        wait_for(lambda: pushes.received, timeout=30)
    ((headers, body),) = pushes.received
    assert headers["x-a2a-notification-token"] == "tok-1" and headers["authorization"] == "Bearer hook-secret"
    assert body["task"]["id"] == task.id and body["task"]["status"]["state"] == "TASK_STATE_CANCELED"


def test_push_configs_are_refused_when_the_card_does_not_offer_them_and_for_another_tenants_task(
    a2a_web: str, people: dict[str, dict[str, str]]
) -> None:
    expose()

    async def scenario() -> list[type[A2AError]]:
        out: list[type[A2AError]] = []
        async with (
            await sdk_client(a2a_web, people["alice"], streaming=False) as alice,
            await sdk_client(a2a_web, people["charlie"], streaming=False) as charlie,
        ):
            (done,) = [r async for r in alice.send_message(send_request(user_message("hi", skill="echo")))]
            config = TaskPushNotificationConfig(task_id=done.task.id, url="http://localhost:9/hook")
            for client in (alice, charlie):
                try:
                    await client.create_task_push_notification_config(config)
                except A2AError as exc:
                    out.append(type(exc))
        return out

    assert run(scenario()) == [PushNotificationNotSupportedError, TaskNotFoundError]
