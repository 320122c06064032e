"""The gateway's one scheduling hook (apps/gateway/waits.py): installed by the
runs app, a gateway wait inside an admitted iteration gives its admission
slot to a queued iteration."""

from __future__ import annotations

import threading

import pytest

from apps.gateway import waits
from apps.runs.engine.admission import ADMISSION

WAIT = 5.0  # bound on every wait; each ends as soon as its event is set


def test_a_gateway_wait_inside_an_iteration_lets_a_queued_iteration_in() -> None:
    if ADMISSION.slots <= 0:
        pytest.skip("admission is off (LOOMCYCLE_ENGINE_ADMISSION_SLOTS=0)")
    release = threading.Event()
    holding = threading.Barrier(ADMISSION.slots + 1)  # every slot taken, and the test
    waiting_outside = threading.Event()
    latecomer_in = threading.Event()

    def holder(goes_outside: bool) -> None:
        with ADMISSION.admitted():
            holding.wait(WAIT)
            if goes_outside:
                with waits.outside():
                    waiting_outside.set()
                    release.wait(WAIT)
            else:
                release.wait(WAIT)

    def latecomer() -> None:
        with ADMISSION.admitted():
            latecomer_in.set()

    threads = [threading.Thread(target=holder, args=(i == 0,), daemon=True) for i in range(ADMISSION.slots)]
    for t in threads:
        t.start()
    try:
        holding.wait(WAIT)  # every slot is held now
        late = threading.Thread(target=latecomer, daemon=True)
        late.start()
        threads.append(late)
        assert latecomer_in.wait(WAIT)  # it took the slot of the holder waiting in the gateway
        assert waiting_outside.is_set()
    finally:
        release.set()
        for t in threads:
            t.join(WAIT)
