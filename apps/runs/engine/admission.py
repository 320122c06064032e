"""Per-process admission of iterations: at most K at a time do engine work.

A worker process runs hundreds of pool threads (so that hundreds of runs can
wait in provider calls at once) but has one GIL. When more iterations are
runnable than that GIL can serve, unbounded threads all make progress
slowly: every iteration's wall time (and the time it holds its lease)
stretches with the backlog, and throughput does not rise. Admission keeps
the backlog in front of the iteration instead, before its claim, as a queue
in the broker would:

- an iteration takes a slot before it claims its run (`admitted`) and gives
  it back when it ends; waiting for one is queueing, not iteration time: the
  iteration has not started and holds no lease;
- a section that waits on the outside world (a remote provider call, the
  mock's simulated latency, a provider-slot or retry wait, a batch of tool
  calls) is marked with `outside(after_s)`: once it has lasted `after_s`
  (0 for sections known to block) its slot goes to the next queued
  iteration, so runs waiting in slow calls never hold the engine;
- an iteration whose slot was given away takes one again when its outside
  section ends, ahead of iterations not yet admitted, so at most K
  iterations per process are ever doing engine work;
- slots = 0 turns admission off.

Knobs (docs/configuration.md): `LOOMCYCLE_ENGINE_ADMISSION_SLOTS` (K, default
2; 0 = off), read once when this module is imported (the semaphore cannot be
resized while threads wait on it), and
`LOOMCYCLE_ENGINE_ADMISSION_TOOLS_AFTER_MS` (`tools_after_s()`, default 20 ms:
how long a batch of tool calls keeps its slot), read for each batch.

Who uses it. `ADMISSION` is the one instance per process. The run engine
(apps.runs.engine) wraps each iteration in `admitted()` and marks its remote
provider calls, retry waits and tool batches `outside()`. The gateway does not
import it: its own waits (the mock provider's simulated latency, a
provider-slot wait) go through `apps.gateway.waits.outside()`, a hook the runs
app sets to `ADMISSION.outside` at AppConfig.ready. Both are no-ops in a
thread that holds no slot (the web process, a test calling a provider).
Measurements: docs/performance.md ("Engine admission").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings


class _Ticket:
    """One admitted iteration. `held`: it has a slot now."""

    __slots__ = ("deadline", "held", "outside")

    def __init__(self) -> None:
        self.held = True
        self.outside = False
        self.deadline = 0.0  # while outside and held: when its slot may be taken


class _Waiter:
    """A queued iteration. Its lock is a one-shot doorbell, released (under
    the admission mutex) to make it look again."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()

    def wake(self) -> None:
        if self.lock.locked():
            self.lock.release()


class Admission:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._mutex = threading.Lock()
        self._free = slots
        self._returning: deque[_Waiter] = deque()  # admitted before, slot given away: served first
        self._queue: deque[_Waiter] = deque()  # not admitted yet
        self._outside: set[_Ticket] = set()  # slot holders inside an outside section
        self._local = threading.local()

    @contextmanager
    def admitted(self) -> Iterator[float]:
        """Hold a slot for the body; yields the seconds spent queued for it."""
        if self.slots <= 0 or getattr(self._local, "ticket", None) is not None:  # off, or nested
            yield 0.0
            return
        t0 = time.perf_counter()
        ticket = _Ticket()
        self._acquire(ticket, self._queue)
        waited = time.perf_counter() - t0
        self._local.ticket = ticket
        try:
            yield waited
        finally:
            self._local.ticket = None
            self._release(ticket)

    @contextmanager
    def outside(self, after_s: float = 0.0) -> Iterator[None]:
        """The current iteration waits on the outside world for the body: its
        slot may go to a queued iteration once the body has lasted `after_s`.
        A no-op outside an admitted iteration and when nested."""
        ticket: _Ticket | None = getattr(self._local, "ticket", None)
        if ticket is None or ticket.outside:
            yield
            return
        with self._mutex:
            ticket.outside = True
            ticket.deadline = time.monotonic() + after_s
            self._outside.add(ticket)
            if head := self._head():
                head.wake()  # it may take this slot now, or sets a timer for it
        try:
            yield
        finally:
            with self._mutex:
                ticket.outside = False
                self._outside.discard(ticket)
                given_away = not ticket.held
            if given_away:
                self._acquire(ticket, self._returning)

    # --- internals (the mutex guards _free, both queues, _outside and tickets' fields)

    def _head(self) -> _Waiter | None:
        if self._returning:
            return self._returning[0]
        return self._queue[0] if self._queue else None

    def _acquire(self, ticket: _Ticket, line: deque[_Waiter]) -> None:
        with self._mutex:
            if self._free > 0 and not self._returning:  # barging: a running thread need not wait
                self._free -= 1
                ticket.held = True
                return
            waiter = _Waiter()
            line.append(waiter)
        while True:
            with self._mutex:
                if self._head() is waiter:
                    if self._free > 0:
                        self._free -= 1
                        self._take(ticket, line)
                        return
                    timeout = -1.0
                    if self._outside:
                        victim = min(self._outside, key=lambda t: t.deadline)
                        timeout = victim.deadline - time.monotonic()
                        if timeout <= 0:  # its outside section has lasted long enough: take its slot
                            self._outside.discard(victim)
                            victim.held = False
                            self._take(ticket, line)
                            return
                else:
                    timeout = -1.0
            waiter.lock.acquire(timeout=timeout)

    def _take(self, ticket: _Ticket, line: deque[_Waiter]) -> None:
        line.popleft()
        ticket.held = True
        if (head := self._head()) and (self._free > 0 or self._outside):
            head.wake()  # the next one takes a free slot too, or watches the outside sections

    def _release(self, ticket: _Ticket) -> None:
        with self._mutex:
            self._outside.discard(ticket)
            if not ticket.held:
                return
            ticket.held = False
            self._free += 1
            if head := self._head():
                head.wake()


# Sized once, when the module is imported (settings read then, not per use): the
# slot count is the worker process's, and a semaphore cannot be resized under
# its waiters. Tests that need other sizes build their own Admission.
ADMISSION = Admission(settings.LOOMCYCLE.engine_admission_slots)


def tools_after_s() -> float:
    """How long a tool batch keeps its slot before a queued iteration may take it."""
    return settings.LOOMCYCLE.engine_admission_tools_after_ms / 1000
