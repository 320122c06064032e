"""Live text on the gRPC run stream (issue 36): the Run stream carries the reply's pieces while
the mock still streams it (against the mock's own send times) and they concatenate to the text."""

from __future__ import annotations

import json
import time

import pytest

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from tests.factories.grpc import user_text
from tests.factories.live import REPLY, committed_text, script, sent_times

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_the_run_stream_carries_live_text_that_concatenates_to_the_committed_text(
    stub: pb_grpc.LoomcycleStub,
) -> None:
    arrived = [(time.time(), e) for e in stub.Run(pb.RunRequest(agent="scripted", segments=user_text(script())))]
    run_id = json.loads(arrived[1][1].error)["run_id"]
    texts = [(at, e.text) for at, e in arrived if e.type == "text"]
    assert len(texts) > 1 and texts[0][0] < sent_times(run_id)[-1]
    assert "".join(t for _, t in texts) == committed_text(run_id) == REPLY
