"""A slow link in user space (issue 41): a TCP proxy a worker host's processes reach Postgres and
Redis through, which holds every chunk back 200 ms ± 100 ms while its fault is on.

This machine's kernel has no sch_netem (tests/netns.py), so the delay cannot be a qdisc. The proxy
runs inside the worker host's namespace, as a process of its own (tests/netns_cluster.py starts it
with `Cluster(delay_proxy=True)`), listening on the host's own address with the Postgres and Redis
ports and forwarding to the Postgres and Redis hosts:

    python -m tests.netns_delay <listen address> <port>:<target address>:<target port> ...

It forwards with no added delay until SIGUSR1 turns the fault on; SIGUSR2 turns it off. While on,
each chunk read in either direction is released `DELAY_S ± JITTER_S` (uniform) after it arrived,
but never before the chunk read before it in the same direction: one FIFO per direction with
release times that never go backwards, so each byte stream keeps its order.

The upstream socket carries the bounds libpq puts on a silent network (settings._network_timeouts,
10 s): a connect timeout, TCP_USER_TIMEOUT and keepalive probes. When the upstream side dies, the
client side is reset, as the client would have seen it without the proxy; a partition of the
worker host (nftables in its namespace, tests/netns.py) cuts the proxy's upstream packets alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import sys
from dataclasses import dataclass

DELAY_S, JITTER_S = 0.2, 0.1
CHUNK = 65536
NETWORK_TIMEOUT_S = 10  # LOOMCYCLE_PG_NETWORK_TIMEOUT_SECONDS's default


@dataclass
class Fault:
    on: bool = False

    def switch(self, on: bool) -> None:
        self.on = on
        print(f"netns_delay: fault {'on' if on else 'off'}", flush=True)  # the harness's log; a test waits on it

    def delay(self) -> float:
        return random.uniform(DELAY_S - JITTER_S, DELAY_S + JITTER_S) if self.on else 0.0


def _bound_silence(sock: socket.socket) -> None:
    """libpq's bounds on a dead peer (module docstring): unacknowledged data and idle probes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    probe = max(1, NETWORK_TIMEOUT_S // 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, probe)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, NETWORK_TIMEOUT_S * 1000)


async def _send(queue: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        at, data = await queue.get()
        if (wait := at - loop.time()) > 0:
            await asyncio.sleep(wait)
        if not data:  # the source's end of stream, after every chunk before it
            if dst.can_write_eof():
                dst.write_eof()
            return
        dst.write(data)
        await dst.drain()


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, fault: Fault) -> None:
    """One direction: each chunk queued with its release time, never earlier than the last one's."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    sender = asyncio.create_task(_send(queue, dst))
    last = 0.0
    try:
        while data := await src.read(CHUNK):
            last = max(loop.time() + fault.delay(), last)
            queue.put_nowait((last, data))
        queue.put_nowait((last, b""))
        await sender
    finally:
        sender.cancel()


async def _connect(target: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    _bound_silence(sock)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, target), NETWORK_TIMEOUT_S)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def _serve(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: tuple[str, int], fault: Fault
) -> None:
    """One client connection forwarded; either side failing resets both (no half-dead pair)."""
    up_w: asyncio.StreamWriter | None = None
    try:
        up_r, up_w = await _connect(target)
        pumps = [asyncio.create_task(_pump(client_r, up_w, fault)), asyncio.create_task(_pump(up_r, client_w, fault))]
        done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        if any(t.exception() for t in done):
            for task in pending:
                task.cancel()
        else:
            await asyncio.gather(*pending, return_exceptions=True)
    except (OSError, TimeoutError) as exc:  # the target is unreachable or a side reset: both are closed below
        print(f"netns_delay: connection to {target[0]}:{target[1]} ended: {exc!r}", flush=True)
    finally:
        for writer in (client_w, up_w):
            if writer is not None:
                writer.transport.abort()


def _route(spec: str) -> tuple[int, tuple[str, int]]:
    port, host, target_port = spec.split(":")
    return int(port), (host, int(target_port))


async def main(listen: str, routes: list[str]) -> None:
    fault = Fault()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, fault.switch, True)
    loop.add_signal_handler(signal.SIGUSR2, fault.switch, False)
    servers = []
    for spec in routes:
        port, target = _route(spec)

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, t: tuple[str, int] = target) -> None:
            await _serve(r, w, t, fault)

        servers.append(await asyncio.start_server(handle, listen, port, reuse_address=True))
    print(f"netns_delay: {listen} -> {' '.join(routes)}", flush=True)
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await stack.enter_async_context(server)
        await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
