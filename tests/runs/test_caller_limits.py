"""A caller's limits can only narrow (issue 16, item 3): the request's
`max_iterations` is at most the agent's cap, and a sub-agent inherits the
tool narrowing of the request that started its parent."""

from __future__ import annotations

import pytest

from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


@pytest.mark.parametrize(
    ("agent", "requested", "expected"),
    [
        ("echo", 1000, 16),  # the agent's default cap
        ("echo", 3, 3),
        ("echo", None, 16),
        ("chat", 2**20 + 1, 2**20),  # interactive: unbounded, still a cap
        ("chat", 7, 7),
    ],
)
def test_requested_max_iterations_never_exceeds_the_agents(agent: str, requested: int | None, expected: int) -> None:
    data = services.RunCreate(agent=agent, segments=[Segment(text="hi")], max_iterations=requested)
    assert services.run_resolve(tenant_id="", data=data).max_iterations == expected


def test_a_sub_agent_inherits_the_callers_tool_narrowing(stack: WorkerPool) -> None:
    data = services.RunCreate(agent="spawner", segments=[Segment(text="hi")], tools=["Agent"])
    parent = services.run_create(principal=ALICE, data=data)
    wait_status(parent.id, RunStatus.COMPLETED, timeout=30)
    child = Run.objects.get(parent_id=parent.id)
    assert Run.objects.get(id=parent.id).tools == ["Agent"]
    assert (child.tools, child.caller_tools) == ([], ["Agent"])  # echo's implicit Context is narrowed away

    free = services.run_create(principal=ALICE, data=services.RunCreate(agent="spawner", segments=[Segment(text="hi")]))
    wait_status(free.id, RunStatus.COMPLETED, timeout=30)
    assert Run.objects.get(parent_id=free.id).tools == ["Context"]  # without narrowing, the child's own tools
