"""Per-process admission of iterations (apps/runs/engine/admission.py), with real threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from apps.runs.engine.admission import Admission

WAIT = 5.0  # generous bound on every wait; the tests end as soon as the condition holds


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


class Holder(threading.Thread):
    """An iteration: takes a slot, optionally goes outside, ends when told."""

    def __init__(self, gate: Admission, name: str, log: list[str], outside: float | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.gate, self.log, self.after = gate, log, outside
        self.admitted = threading.Event()
        self.release = threading.Event()
        self.go = threading.Event()  # go outside (set unless a test clears it)
        self.go.set()
        self.back = threading.Event()  # the outside call returns
        self.waited = -1.0

    def run(self) -> None:
        with self.gate.admitted() as waited:
            self.waited = waited
            self.log.append(self.name)
            self.admitted.set()
            if self.after is not None:
                self.go.wait(WAIT)
                with self.gate.outside(self.after):
                    self.back.wait(WAIT)
                self.log.append(f"{self.name} back")
            self.release.wait(WAIT)


def _admitted(holder: Holder) -> Holder:
    """Starts `holder` and waits until it holds a slot."""
    holder.start()
    assert holder.admitted.wait(WAIT)
    return holder


def _free(gate: Admission) -> int:
    return gate._free


def test_at_most_k_admitted_and_the_queue_is_fifo() -> None:
    gate = Admission(slots=2)
    log: list[str] = []
    a, b = Holder(gate, "a", log), Holder(gate, "b", log)
    a.start(), b.start()
    assert a.admitted.wait(WAIT) and b.admitted.wait(WAIT)
    queued = [Holder(gate, f"q{i}", log) for i in range(3)]
    for i, q in enumerate(queued):
        q.start()
        _until(lambda i=i: len(gate._queue) == i + 1)  # type: ignore[misc]  # queued in this order
    time.sleep(0.05)
    assert not any(q.admitted.is_set() for q in queued)
    a.release.set()
    assert queued[0].admitted.wait(WAIT)
    assert not queued[1].admitted.is_set()
    b.release.set()
    assert queued[1].admitted.wait(WAIT)
    assert not queued[2].admitted.is_set()
    for q in queued:
        q.release.set()
        q.join(WAIT)
    a.join(WAIT), b.join(WAIT)
    assert log == ["a", "b", "q0", "q1", "q2"]
    assert queued[0].waited >= 0.05
    assert _free(gate) == 2 and not gate._queue and not gate._outside


def test_a_long_outside_section_gives_its_slot_away_and_takes_one_back_first() -> None:
    gate = Admission(slots=1)
    log: list[str] = []
    slow = _admitted(Holder(gate, "slow", log, outside=0.05))
    _until(lambda: bool(gate._outside))
    t0 = time.monotonic()
    nxt = _admitted(Holder(gate, "next", log))
    assert time.monotonic() - t0 >= 0.04  # not before the section had lasted after_s
    later = Holder(gate, "later", log)
    later.start()
    _until(lambda: len(gate._queue) == 1)
    slow.back.set()  # its section ends: it queues for a slot again, ahead of `later`
    _until(lambda: len(gate._returning) == 1)
    assert log == ["slow", "next"]
    nxt.release.set()
    _until(lambda: "slow back" in log)
    assert not later.admitted.is_set()  # at most one iteration in the engine at a time
    slow.release.set()
    assert later.admitted.wait(WAIT)
    later.release.set()
    for h in (slow, nxt, later):
        h.join(WAIT)
    assert log == ["slow", "next", "slow back", "later"]
    assert _free(gate) == 1 and not gate._outside and not gate._queue and not gate._returning


def test_a_blocking_section_gives_its_slot_at_once_to_a_queued_iteration() -> None:
    gate = Admission(slots=1)
    log: list[str] = []
    holder = Holder(gate, "h", log, outside=0.0)
    holder.go.clear()
    holder.start()
    assert holder.admitted.wait(WAIT)
    waiter = Holder(gate, "w", log)
    waiter.start()
    _until(lambda: bool(gate._queue))
    holder.go.set()
    assert waiter.admitted.wait(WAIT)
    waiter.release.set()
    holder.back.set(), holder.release.set()
    holder.join(WAIT), waiter.join(WAIT)
    assert _free(gate) == 1


def test_a_short_outside_call_keeps_its_slot() -> None:
    gate = Admission(slots=1)
    log: list[str] = []
    holder = _admitted(Holder(gate, "h", log, outside=10.0))
    _until(lambda: bool(gate._outside))
    waiter = Holder(gate, "w", log)
    waiter.start()
    _until(lambda: bool(gate._queue))
    holder.back.set()
    _until(lambda: not gate._outside)
    time.sleep(0.05)
    assert not waiter.admitted.is_set()
    holder.release.set()
    assert waiter.admitted.wait(WAIT)
    waiter.release.set()
    holder.join(WAIT), waiter.join(WAIT)
    assert _free(gate) == 1


def test_an_outside_call_wakes_a_head_that_was_waiting_with_no_deadline() -> None:
    """The head of the queue sleeps without a timeout while nobody is
    outside; a holder going outside later must still free its slot."""
    gate = Admission(slots=1)
    log: list[str] = []
    holder = Holder(gate, "h", log, outside=0.02)
    holder.go.clear()  # admitted, but not outside yet
    holder.start()
    assert holder.admitted.wait(WAIT)
    waiter = Holder(gate, "w", log)
    waiter.start()
    _until(lambda: bool(gate._queue))
    time.sleep(0.05)
    assert not waiter.admitted.is_set()
    holder.go.set()
    assert waiter.admitted.wait(WAIT)  # without the holder leaving
    assert not holder.release.is_set()
    waiter.release.set()
    holder.back.set(), holder.release.set()
    for h in (holder, waiter):
        h.join(WAIT)
    assert _free(gate) == 1


def test_many_threads_never_exceed_the_slots_and_all_finish() -> None:
    gate = Admission(slots=3)
    inside = 0
    peak = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def engine_work() -> None:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        time.sleep(0.0002)
        with lock:
            inside -= 1

    def iteration(i: int) -> None:
        try:
            with gate.admitted():
                engine_work()
                if i % 3 == 0:
                    with gate.outside(0.001 if i % 2 else 0.0):
                        time.sleep(0.003)  # long enough to give the slot away
                engine_work()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=iteration, args=(i,)) for i in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    assert not errors and not any(t.is_alive() for t in threads)
    assert _free(gate) == 3 and not gate._queue and not gate._returning and not gate._outside
    assert 2 <= peak <= 3  # concurrency was used, and never more than the slots


def test_zero_slots_is_no_limit() -> None:
    gate = Admission(slots=0)
    with gate.admitted() as w1, gate.admitted() as w2, gate.outside():
        assert w1 == 0.0 and w2 == 0.0
