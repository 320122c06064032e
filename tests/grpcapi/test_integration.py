"""ListChildRuns and StreamUserRunStates (issue 38) over a real gRPC server: the twins of
GET /v1/runs/{id}/children and GET /v1/users/{user_id}/agents/stream."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.runs.models import Run
from tests.factories.grpc import user_text

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _run(stub: pb_grpc.LoomcycleStub, user: str = "u1") -> str:
    events = list(stub.Run(pb.RunRequest(agent="echo", segments=user_text("hi"), user_id=user), timeout=60))
    return str(json.loads(events[1].error)["run_id"])


def test_list_child_runs_pages_a_runs_children(stub: pb_grpc.LoomcycleStub) -> None:
    parent, kids = _run(stub), [_run(stub) for _ in range(3)]
    Run.objects.filter(id__in=kids).update(parent_id=parent, depth=1)  # as Agent spawns record them
    first = stub.ListChildRuns(pb.ListChildRunsRequest(parent_run_id=parent, limit=2), timeout=10)
    rest = stub.ListChildRuns(pb.ListChildRunsRequest(parent_run_id=parent, cursor=first.next_cursor), timeout=10)
    assert [a.run_id for a in [*first.agents, *rest.agents]] == kids[::-1] and rest.next_cursor == ""
    assert all(a.parent_run_id == parent for a in first.agents)
    with pytest.raises(grpc.RpcError) as err:
        stub.ListChildRuns(pb.ListChildRunsRequest(parent_run_id="r_0000000000000000"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_stream_user_run_states_follows_the_users_runs(stub: pb_grpc.LoomcycleStub) -> None:
    stream = stub.StreamUserRunStates(pb.StreamUserRunStatesRequest(user_id="dora", statuses=["completed"]), timeout=60)
    got: list[pb.RunStateEvent] = []
    reader = threading.Thread(target=lambda: got.append(next(iter(stream))), daemon=True)
    reader.start()
    _run(stub, user="other")
    run_id = _run(stub, user="dora")
    reader.join(30)
    stream.cancel()
    assert [(e.run_id, e.status, e.user_id) for e in got] == [(run_id, "completed", "dora")]
