"""kombu's Redis transport, tuned for many small tasks with late acks.

Chosen by its dotted path, never by a process-wide alias: settings.py sets
Celery's `broker_transport` to `workers.transport:Transport` (redis:// URLs)
or `workers.transport:SocketTransport` (redis+socket://, see below) when
`LOOMCYCLE_FAST_TRANSPORT` is on (the default). With it off, Celery uses
kombu's stock Redis transport and doorbells go through `send_task`
(docs/configuration.md): the fallback when a kombu upgrade breaks this module.
Any other scheme (rediss://, sentinel://) keeps kombu's transport for it.

Three changes, made by subclassing kombu's Channel, QoS and Transport:

- One reused client per channel. kombu's Redis `Channel` builds a new
  `redis.Redis` object for every synchronous operation (each publish, ack and
  QoS update): ~150 us of Python per object, several per iteration. A
  `redis.Redis` over a connection pool is thread-safe (each command borrows a
  pooled connection), so one client per channel and pool serves them all.

- Deferred acks. With `acks_late`, kombu keeps each delivered message in an
  "unacked" hash and sorted set, and removes it on ack: one MULTI/EXEC
  pipeline to add it and one to remove it, both on the worker's event-loop
  thread, which every task passes through. Here `ack` settles the prefetch
  count at once and queues the removal; the removal rides along with the next
  delivery's pipeline, or goes out on its own ACK_FLUSH_S later, and before a
  channel restores its unacked messages at shutdown. What a deferred ack can
  cost: if the process dies in those few milliseconds, the message is
  restored after the visibility timeout and delivered again. Our tasks are
  doorbells whose duplicates are no-ops (the run engine's claim), and a lost
  worker's runs are recovered by the lease sweeper long before that.

- No kombu copy of doorbells. A `runs.iterate` message is a doorbell: what
  makes the iteration durable is the run row in Postgres (its lease, fencing
  token and step) and the beat sweeper that re-rings a run whose lease
  expired or whose doorbell went missing. kombu's unacked hash and index
  would only redeliver it after the visibility timeout (two hours), long
  after the sweeper. So for these messages `append` keeps the delivery in
  memory plus one HSET in this worker's held hash (workers/held.py: the
  sweeper re-rings a dead worker's held doorbells), sparing the event-loop
  thread kombu's MULTI/EXEC round trip per message; the ack's HDEL is
  deferred like the other acks. A doorbell still unacked when its channel
  closes (warm or cold shutdown), or rejected with requeue, is pushed back
  onto its queue as kombu would. Every other task keeps kombu's bookkeeping.

Private kombu API this module (and workers/held.py) relies on. These are not
kombu's extension points; they were read in kombu 5.7.0's source
(WRITTEN_FOR_KOMBU), and tests/core/test_kombu_seams.py pins each one and
the kombu version, so that an upgrade that changes them fails loudly instead
of misbehaving:

- `virtual.QoS.append(self, message, delivery_tag)` and
  `virtual.QoS.ack(self, delivery_tag)`, called directly to bypass the Redis
  QoS's own `append`/`ack` (their MULTI/EXEC round trips) while keeping the
  prefetch accounting (`_delivered`, `can_consume`) in kombu's hands.
- The Redis QoS's unacked bookkeeping, rewritten here for non-doorbells as
  kombu writes it: `unacked_key` / `unacked_index_key`, `pipe_or_acquire()`,
  and the entry format `[message._raw, exchange, routing_key]` (JSON) that
  its `restore_by_tag` / `restore_visible` read back.
- `message._raw`: the virtual Message's payload as it came off the queue.
- The Redis QoS's `reject(tag, requeue)` calling `self.restore_by_tag(tag,
  leftmost=True)` for a requeue, and `restore_by_tag(tag, client, leftmost)`
  / `restore_unacked_once(stderr)` as the methods kombu calls to put messages
  back (overridden to restore doorbells from memory and to flush acks first).
- `Channel._do_restore_message(payload, exchange, routing_key, pipe,
  leftmost)`: pushes a message back onto its queue, as kombu's own restore
  does (here and in workers/held.py).
- `Channel._create_client(asynchronous)`: overridden to reuse one client.
- `Channel._qos`: read by the ack flusher, so that it creates no QoS for a
  channel that never consumed (`Channel.qos` would).
- `Transport.register_with_event_loop(connection, loop)` and the hub's
  `call_repeatedly`: where the ack flusher is scheduled.
- `Channel.conn_or_acquire(client)`: the connection a restore writes through;
  `Channel.client` (the channel's client, also in workers/held.py) and
  `Channel.pool` (its connection pool, which the reused client is built on);
  `Transport.channels` (the open channels the ack flusher walks) and
  `QoS.channel` (the channel a QoS belongs to).

`SocketTransport` relies on kombu's documented `Transport.can_parse_url`: kombu
reads a transport name from a `redis+socket://` URL's prefix, ahead of any
`broker_transport`, and (since 5.7) refuses a dotted path there. So settings.py
gives Celery the `socket://` form and this class, which takes the URL
unparsed: kombu's Redis channel then gets the `socket:///path` host it gets
from the `+` form and connects to the Unix socket.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps
from redis import RedisError

from workers import held
from workers.queues import DOORBELL_TASKS

log = logging.getLogger("loomcycle.transport")

ACK_FLUSH_S = 0.02
# The kombu release whose private API (above) this module was written against.
WRITTEN_FOR_KOMBU = "5.7.0"


class QoS(kombu_redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending_acks: list[tuple[str, bool]] = []  # (delivery tag, is a doorbell)
        self._acks_lock = threading.Lock()
        self._doorbells: dict[str, tuple[Any, str, str]] = {}  # delivery tag -> (raw message, exchange, routing key)

    def append(self, message: Any, delivery_tag: str) -> None:
        delivery = message.delivery_info
        restorable = (message._raw, delivery["exchange"], delivery["routing_key"])
        if (message.headers or {}).get("task") in DOORBELL_TASKS:
            self._doorbells[delivery_tag] = restorable
            # Synchronous (with the pending acks): once it returns, a kill -9 cannot lose the doorbell.
            channel: Any = self.channel  # the Redis channel (typed as kombu's virtual one)
            pipe = channel.client.pipeline(transaction=False)
            acks = self._take_acks(pipe)
            pipe.hset(held.held_key(), delivery_tag, held.entry(*restorable))
            self._execute(pipe, acks)
            virtual.QoS.append(self, message, delivery_tag)
            return
        entry = dumps(list(restorable))
        with self.pipe_or_acquire() as pipe:
            acks = self._take_acks(pipe)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            pipe.hset(self.unacked_key, delivery_tag, entry)
            self._execute(pipe, acks)
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        doorbell = self._doorbells.pop(delivery_tag, None) is not None
        with self._acks_lock:
            self._pending_acks.append((delivery_tag, doorbell))
        virtual.QoS.ack(self, delivery_tag)  # prefetch accounting now; Redis with the next pipeline

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue and delivery_tag in self._doorbells:
            self.ack(delivery_tag)  # drops its held entry (workers/held.py) with the acks
            return
        super().reject(delivery_tag, requeue)  # a requeued doorbell comes back from memory (restore_by_tag)

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        """Back onto its queue; a doorbell from memory, anything else from the unacked hash."""
        doorbell = self._doorbells.pop(tag, None)
        if doorbell is None:
            super().restore_by_tag(tag, client, leftmost)
            return
        raw, exchange, routing_key = doorbell
        channel: Any = self.channel  # the Redis channel (typed as kombu's virtual one)
        with channel.conn_or_acquire(client) as conn:
            pipe = conn.pipeline()
            channel._do_restore_message(raw, exchange, routing_key, pipe, leftmost)
            pipe.hdel(held.held_key(), tag)
            pipe.execute()

    def flush_acks(self) -> None:
        if not self._pending_acks:
            return
        with self.pipe_or_acquire() as pipe:
            self._execute(pipe, self._take_acks(pipe))

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        if self.channel.connection.client is None:
            # After a lost broker, Celery's consumer collects the connection (which detaches the
            # transport) and then closes it, closing this channel: kombu's restore would build a
            # client from the detached transport and raise AttributeError, which stops the worker.
            # Nothing can be restored without the broker anyway: the delivered tasks keep running
            # here, and a lost doorbell is re-rung by the lease sweep (architecture.md).
            log.warning("broker connection lost; %d delivered message(s) not restored", len(self._delivered or ()))
            return None
        try:
            self.flush_acks()
        except (RedisError, OSError):  # left unflushed, those messages are restored and redelivered as no-ops
            log.exception("could not settle %d acks before restoring unacked messages", len(self._pending_acks))
        return super().restore_unacked_once(stderr)

    def _take_acks(self, pipe: Any) -> list[tuple[str, bool]]:
        with self._acks_lock:
            acks, self._pending_acks = self._pending_acks, []
        for tag, doorbell in acks:
            if doorbell:
                pipe.hdel(held.held_key(), tag)
                continue
            pipe.zrem(self.unacked_index_key, tag)
            pipe.hdel(self.unacked_key, tag)
        return acks

    def _execute(self, pipe: Any, acks: list[tuple[str, bool]]) -> None:
        try:
            pipe.execute()
        except BaseException:  # the acks stay pending for the next pipeline
            with self._acks_lock:
                self._pending_acks[:0] = acks
            raise


class Channel(kombu_redis.Channel):
    QoS = QoS
    _lc_client: tuple[Any, Any] | None = None  # (pool, client)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        cached = self._lc_client
        if cached is None or cached[0] is not pool:  # a reconnect replaces the pool
            cached = self._lc_client = (pool, super()._create_client())  # type: ignore[misc]
        return cached[1]


class Transport(kombu_redis.Transport):
    Channel = Channel

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        old = getattr(self, "_lc_acks_tref", None)
        if old is not None:  # a reconnect registers again
            old.cancel()
        self._lc_acks_tref = loop.call_repeatedly(ACK_FLUSH_S, self._flush_acks)

    def _flush_acks(self) -> None:
        for channel in list(self.channels or ()):
            qos = channel._qos
            if not isinstance(qos, QoS):
                continue
            try:
                qos.flush_acks()
            except (RedisError, OSError):  # retried on the next tick; kombu's reconnect handles the link
                log.exception("could not settle %d acks; retrying", len(qos._pending_acks))


def recover() -> int:
    """The sweeper's entry point: `held.recover_dead` over the broker, when it is served by
    this transport (with any other transport, kombu's own bookkeeping applies). It lives
    here, not in workers/held.py, so that the imports run one way: transport -> held."""
    from celery import current_app

    from apps.core.redis import sync_client

    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        if not isinstance(channel, Channel):
            return 0
        return held.recover_dead(channel, sync_client())


class SocketTransport(Transport):
    """`Transport` for a Unix socket broker URL in its `socket:///path` form
    (settings.py turns `redis+socket://` into it): kombu passes the URL
    through unparsed and the Redis channel connects to the path."""

    can_parse_url = True
