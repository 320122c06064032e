"""workers/transport.py against the real Redis broker: deferred acks keep
kombu's late-ack bookkeeping exact (an acked message is never restored, an
unacked one still is); run doorbells never enter the unacked hash yet count
against the prefetch window and are restored at close or on a requeue; they
are held in their worker's hash until acked, and a worker without presence
has them pushed back (workers/held.py); and workers leave no unacked entry of
a finished run (that one holds with kombu's stock transport too, the rest
are skipped with LOOMCYCLE_FAST_TRANSPORT=0). The broker connection is the
Celery app's, so its transport is the one settings.py names."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import current_app
from kombu import Consumer, Exchange, Producer, Queue

from apps.core.redis import sync_client
from apps.runs.models import RunStatus
from tests.conftest import ALICE, needs_fast_transport, wait_for, wait_status
from tests.procs import WorkerPool
from workers import held
from workers.queues import ITERATE_TASK
from workers.transport import QoS


@pytest.fixture
def broker() -> Iterator[tuple[Any, Queue]]:
    queue = Queue(f"lc-test-{uuid.uuid4().hex[:8]}", Exchange("", type="direct"), routing_key="")
    with current_app.connection_for_write() as conn:
        channel = conn.channel()
        queue = queue.bind(channel)
        queue.routing_key = queue.name
        queue.declare()
        try:
            yield channel, queue
        finally:
            client = conn.default_channel.client
            client.delete(queue.name)
            if not channel.closed:
                channel.close()


def publish(channel: Any, queue: Queue, *bodies: str, task: str | None = None) -> None:
    producer = Producer(channel)
    for body in bodies:
        headers = {"task": task} if task else {}
        producer.publish(body, routing_key=queue.name, serializer="json", headers=headers)


def queued(channel: Any, queue: Queue) -> list[dict[str, Any]]:
    return [json.loads(m) for m in channel.client.lrange(queue.name, 0, -1)]


def receive(channel: Any, queue: Queue, n: int) -> list[Any]:
    got: list[Any] = []
    channel.basic_qos(0, n, False)
    with Consumer(channel, [queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"]):
        while len(got) < n:
            channel.connection.client.drain_events(timeout=5)
    return got


def unacked_tags(channel: Any) -> set[str]:
    return {t.decode() for t in channel.client.hkeys(channel.unacked_key)}


@needs_fast_transport
def test_an_ack_is_settled_by_the_next_delivery_or_a_flush(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    assert isinstance(channel.qos, QoS)
    publish(channel, queue, "one", "two", "three")
    [first] = receive(channel, queue, 1)
    first.ack()
    assert first.delivery_tag in unacked_tags(channel)  # deferred: no round trip on the ack itself
    assert channel.qos.can_consume()  # the prefetch window is freed at once
    [second] = receive(channel, queue, 1)
    assert first.delivery_tag not in unacked_tags(channel)  # rode along with the next delivery
    assert second.delivery_tag in unacked_tags(channel)
    second.ack()
    channel.qos.flush_acks()
    assert second.delivery_tag not in unacked_tags(channel)


@needs_fast_transport
def test_closing_restores_only_what_was_not_acked(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    publish(channel, queue, "acked", "unacked")
    acked, unacked = receive(channel, queue, 2)
    acked.ack()
    assert {acked.delivery_tag, unacked.delivery_tag} <= unacked_tags(channel)
    channel.close()  # kombu restores unacked messages at shutdown; the pending ack is settled first
    with current_app.connection_for_write() as conn:
        client = conn.default_channel.client
        back = [json.loads(m)["properties"]["delivery_tag"] for m in client.lrange(queue.name, 0, -1)]
        tags = {t.decode() for t in client.hkeys(conn.default_channel.unacked_key)}
    assert back == [unacked.delivery_tag]
    assert not {acked.delivery_tag, unacked.delivery_tag} & tags


@needs_fast_transport
def test_a_doorbell_has_no_redis_copy_but_holds_its_prefetch_slot(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    publish(channel, queue, "bell", task=ITERATE_TASK)
    publish(channel, queue, "other", task="maintenance.run_leases_sweep")
    [bell] = receive(channel, queue, 1)
    assert bell.headers["task"] == ITERATE_TASK
    assert bell.delivery_tag not in unacked_tags(channel)  # no MULTI/EXEC round trip for it
    channel.basic_qos(0, 1, False)
    assert not channel.qos.can_consume()  # the window still counts it
    bell.ack()
    assert channel.qos.can_consume()
    [other] = receive(channel, queue, 1)
    assert other.delivery_tag in unacked_tags(channel)  # every other task keeps kombu's copy
    other.ack()
    channel.qos.flush_acks()
    assert not unacked_tags(channel) & {bell.delivery_tag, other.delivery_tag}
    assert queued(channel, queue) == []


@needs_fast_transport
def test_a_doorbell_rejected_with_requeue_goes_back_onto_its_queue(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    publish(channel, queue, "kept", "dropped", task=ITERATE_TASK)
    kept, dropped = receive(channel, queue, 2)
    kept.reject(requeue=True)
    dropped.reject(requeue=False)
    [back] = queued(channel, queue)
    assert back["properties"]["delivery_tag"] == kept.delivery_tag
    assert back["headers"]["redelivered"] is True
    assert channel.qos.can_consume()
    assert not channel.qos._doorbells  # neither is still held in memory


@needs_fast_transport
def test_closing_restores_unacked_doorbells_too(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    publish(channel, queue, "acked", "unacked", task=ITERATE_TASK)
    acked, unacked = receive(channel, queue, 2)
    acked.ack()
    channel.close()  # warm or cold shutdown: the doorbell is pushed back as kombu pushes its own
    with current_app.connection_for_write() as conn:
        client = conn.default_channel.client
        back = [json.loads(m) for m in client.lrange(queue.name, 0, -1)]
    assert [m["properties"]["delivery_tag"] for m in back] == [unacked.delivery_tag]
    assert base64.b64decode(back[0]["body"]).decode() == '"unacked"'


@pytest.mark.usefixtures("agents")
def test_workers_leave_no_unacked_entries(stack: WorkerPool) -> None:
    from apps.runs import services
    from apps.runs.prompt import Segment

    runs = [
        services.run_create(principal=ALICE, data=services.RunCreate(agent="toolcaller", segments=[Segment(text="x")]))
        for _ in range(5)
    ]
    for run in runs:
        wait_status(run.id, RunStatus.COMPLETED)
    ids = {run.id for run in runs}

    def ours_unacked() -> list[str]:  # (workers killed by other tests leave theirs until the visibility timeout)
        entries = channel.client.hvals(channel.unacked_key)
        bodies = [base64.b64decode(json.loads(e)[0]["body"]).decode() for e in entries]
        return [b for b in bodies if any(i in b for i in ids)]

    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        wait_for(lambda: not ours_unacked(), timeout=5)


def held_tags(channel: Any) -> set[str]:
    return {t.decode() for t in channel.client.hkeys(held.held_key())}


@needs_fast_transport
def test_a_doorbell_is_held_in_its_workers_hash_until_acked(broker: tuple[Any, Queue]) -> None:
    channel, queue = broker
    publish(channel, queue, "acked", "requeued", task=ITERATE_TASK)
    acked, requeued = receive(channel, queue, 2)
    assert {acked.delivery_tag, requeued.delivery_tag} <= held_tags(channel)  # written before delivery returns
    acked.ack()
    channel.qos.flush_acks()
    requeued.reject(requeue=True)
    assert not {acked.delivery_tag, requeued.delivery_tag} & held_tags(channel)


@needs_fast_transport
def test_the_doorbells_of_a_worker_without_presence_go_back_to_the_front_of_their_queue(
    broker: tuple[Any, Queue],
) -> None:
    channel, queue = broker
    publish(channel, queue, "taken", task=ITERATE_TASK)
    [taken] = receive(channel, queue, 1)
    publish(channel, queue, "waiting", task=ITERATE_TASK)
    presence = sync_client()
    presence.set(held.PRESENCE_PREFIX + held.WORKER_ID, "alive", ex=30)
    try:
        assert held.recover_dead(channel, presence) == 0  # a live worker keeps what it holds
    finally:
        presence.delete(held.PRESENCE_PREFIX + held.WORKER_ID)
    # This process now looks dead: its doorbells are recovered, here or by a session worker's lease sweep
    # (it runs transport.recover too, and may win the race), so the count here may be 0; the outcome may not vary.
    held.recover_dead(channel, presence)
    assert not channel.client.exists(held.held_key())
    back = [base64.b64decode(m["body"]).decode() for m in reversed(queued(channel, queue))]  # BRPOP order
    assert back == ['"taken"', '"waiting"']
    assert taken.delivery_tag not in held_tags(channel)
