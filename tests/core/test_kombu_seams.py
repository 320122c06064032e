"""The private kombu API that workers/transport.py and workers/held.py rely on
(listed in workers/transport.py's docstring), pinned: the kombu release they
were written for, and each method's signature, attribute and behaviour they
assume. A kombu upgrade that changes any of them fails here, naming it, rather
than misbehaving at runtime. tests/core/test_transport.py exercises the
transport itself against Redis.

Skipped with LOOMCYCLE_FAST_TRANSPORT=0: that is the fallback while
workers/transport.py is adapted to a new kombu."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import kombu
import pytest
from kombu.transport import TRANSPORT_ALIASES, resolve_transport, virtual
from kombu.transport import redis as kombu_redis

from tests.conftest import needs_fast_transport
from workers import transport

pytestmark = needs_fast_transport


def changed(what: str) -> str:
    return f"kombu changed {what}: run with LOOMCYCLE_FAST_TRANSPORT=0 and adapt workers/transport.py"


def params(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """(name, default) of each parameter; `inspect.Parameter.empty` when it has none."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


def test_the_installed_kombu_is_the_one_the_transport_was_written_for() -> None:
    assert kombu.__version__ == transport.WRITTEN_FOR_KOMBU, changed(
        f"version ({kombu.__version__}, workers/transport.py was written for {transport.WRITTEN_FOR_KOMBU}): "
        "check each private API its docstring lists, then update WRITTEN_FOR_KOMBU"
    )


SIGNATURES: list[tuple[str, Callable[..., Any], list[tuple[str, Any]]]] = [
    ("virtual.QoS.append", virtual.QoS.append, [("self", E), ("message", E), ("delivery_tag", E)]),
    ("virtual.QoS.ack", virtual.QoS.ack, [("self", E), ("delivery_tag", E)]),
    ("redis QoS.reject", kombu_redis.QoS.reject, [("self", E), ("delivery_tag", E), ("requeue", False)]),
    (
        "redis QoS.restore_by_tag",
        kombu_redis.QoS.restore_by_tag,
        [("self", E), ("tag", E), ("client", None), ("leftmost", False)],
    ),
    ("redis QoS.restore_unacked_once", kombu_redis.QoS.restore_unacked_once, [("self", E), ("stderr", None)]),
    ("redis QoS.pipe_or_acquire", kombu_redis.QoS.pipe_or_acquire, [("self", E), ("pipe", None), ("client", None)]),
    (
        "redis Channel._do_restore_message",
        kombu_redis.Channel._do_restore_message,
        [("self", E), ("payload", E), ("exchange", E), ("routing_key", E), ("pipe", E), ("leftmost", False)],
    ),
    ("redis Channel._create_client", kombu_redis.Channel._create_client, [("self", E), ("asynchronous", False)]),
    ("redis Channel.conn_or_acquire", kombu_redis.Channel.conn_or_acquire, [("self", E), ("client", None)]),
    (
        "redis Transport.register_with_event_loop",
        kombu_redis.Transport.register_with_event_loop,
        [("self", E), ("connection", E), ("loop", E)],
    ),
]


@pytest.mark.parametrize(("what", "fn", "expected"), SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_the_private_methods_keep_their_signatures(what: str, fn: Callable[..., Any], expected: list[Any]) -> None:
    assert params(fn) == expected, changed(f"{what}{inspect.signature(fn)}")


def test_the_redis_qos_keeps_its_unacked_bookkeeping() -> None:
    """The transport writes kombu's unacked entries itself for non-doorbells and
    calls virtual.QoS.append/ack around them: the Redis QoS must still be a
    virtual QoS whose append/ack do exactly that, and nothing more."""
    assert issubclass(kombu_redis.QoS, virtual.QoS), changed("the Redis QoS's base class")
    for name in ("unacked_key", "unacked_index_key"):
        assert name in vars(kombu_redis.QoS), changed(f"the Redis QoS's {name}")
    append = inspect.getsource(kombu_redis.QoS.append)
    for piece in ("self.unacked_index_key", "self.unacked_key", "dumps([message._raw, EX, RK])", "super().append"):
        assert piece in append, changed(f"the Redis QoS.append (no longer `{piece}`)")
    ack = inspect.getsource(kombu_redis.QoS.ack)
    assert "_remove_from_indices" in ack and "super().ack" in ack, changed("the Redis QoS.ack")
    restore = inspect.getsource(kombu_redis.QoS.restore_by_tag)
    assert "loads(" in restore and "_do_restore_message(M, EX, RK, pipe, leftmost)" in restore, changed(
        "the unacked entry format that QoS.restore_by_tag reads back"
    )
    reject = inspect.getsource(kombu_redis.QoS.reject)
    assert "self.restore_by_tag(delivery_tag, leftmost=True)" in reject, changed(
        "the Redis QoS.reject (it no longer restores a requeued message through restore_by_tag)"
    )


def test_a_virtual_message_keeps_its_raw_payload_and_a_channel_its_qos_slot() -> None:
    payload = {"body": "", "properties": {"delivery_tag": "t", "delivery_info": {}}, "headers": {}}
    message = virtual.Message(payload, channel=None)
    assert getattr(message, "_raw", None) is payload, changed("virtual.Message._raw")
    init = inspect.getsource(virtual.Channel.__init__)
    assert "self._qos = None" in init, changed("virtual.Channel._qos")
    assert "self._qos" in inspect.getsource(virtual.Channel.qos.fget), changed("virtual.Channel.qos")


def test_the_fast_transport_is_named_by_its_dotted_path_not_an_alias() -> None:
    alias = TRANSPORT_ALIASES["redis"]
    assert alias == "kombu.transport.redis:Transport", changed(f"the redis alias to {alias} (or we mutated it)")
    assert resolve_transport("workers.transport:Transport") is transport.Transport
    assert resolve_transport("workers.transport:SocketTransport") is transport.SocketTransport
    assert kombu_redis.Transport.can_parse_url is False, changed("the Redis transport's URL parsing")
    assert transport.SocketTransport.can_parse_url is True


def test_kombu_reads_a_plus_urls_prefix_as_its_transport_and_passes_an_explicit_one_through() -> None:
    """Why settings.py hands kombu `socket://` with SocketTransport: a `+` URL's
    prefix wins over the transport argument, and a parsed `socket://` URL loses
    its path; SocketTransport keeps it as the host the Redis channel reads."""
    plus = kombu.Connection("redis+socket:///tmp/r.sock", transport="workers.transport:Transport")
    assert plus.transport_cls == "redis", changed("how a redis+socket:// URL picks its transport")
    sock = kombu.Connection("socket:///tmp/r.sock", transport="workers.transport:SocketTransport")
    assert (sock.transport_cls, sock.hostname) == ("workers.transport:SocketTransport", "socket:///tmp/r.sock"), (
        changed("how a transport with can_parse_url receives the URL")
    )
