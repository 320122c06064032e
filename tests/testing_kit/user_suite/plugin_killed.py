"""Run by tests/testing_kit/test_plugin.py: records the runtime's processes,
then blocks until the outer test kills this pytest process with SIGKILL."""

import threading

from kit_record import record_runtime


def test_block_until_killed(loomcycle_runtime):
    record_runtime(loomcycle_runtime)
    threading.Event().wait()  # never set: the outer test kills this process
