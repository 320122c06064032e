"""No silent drops (issue 35, section 2): a run request's `sampling`, `compaction` and
`parent_context` take effect, and every field of SPEC's `POST /v1/runs` body and of the
agent definition is either read by the runtime or announced with a `capability_inert`
event at run start. In-process (run creation writes the first events; no worker needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.runs import inert, services
from apps.runs.models import Run, RunEvent
from apps.runs.presenters import agent_out
from apps.runs.prompt import Segment
from apps.runs.run_options import RunOptions
from apps.runs.schemas import RunCreateIn
from apps.substrate.kinds import get_kind
from apps.substrate.services import Author, def_create
from tests.conftest import ALICE

APPS = Path(__file__).resolve().parents[2] / "apps"

# SPEC 2.3, POST /v1/runs: every body field loomcycle defines.
SPEC_RUN_FIELDS = {
    "agent", "segments", "prompt", "tools", "allowed_hosts", "web_search_filter", "session_id", "tenant_id",
    "user_id", "agent_id", "user_tier", "user_bearer", "user_credentials", "parent_context", "metadata",
    "run_timeout_seconds", "interactive", "sampling", "compaction",
}  # fmt: skip
# SPEC 5.1, AgentContent's closed set, plus the yaml fields SPEC Appendix D adds to an agent.
SPEC_AGENT_FIELDS = {
    "channels", "code_body", "compaction", "core_blocks", "description", "effort", "evaluation_scopes",
    "history_scope", "inherit_core_blocks", "inject_tool_guide", "internal", "interruption",
    "max_concurrent_children", "max_iterations", "max_tokens", "memory_backend", "memory_consolidation",
    "memory_index_max_bytes", "memory_inject_max_tokens", "memory_protocol", "memory_quota_bytes", "memory_roots",
    "memory_scopes", "model", "models", "name", "provider", "providers", "search_providers", "sampling",
    "sql_quota_bytes", "sql_scopes", "system_prompt", "tier", "tools", "unbounded_iterations",
    "run_timeout_seconds", "retry_attempts", "skills", "disable_context", "volumes",
}  # fmt: skip
# Where a field's name appears without being acted on: its schema, hash, loader and this report.
NOT_READERS = ("substrate/hashing.py", "substrate/kinds", "substrate/yaml", "migrations/", "runs/inert.py")


def _read_somewhere(name: str) -> bool:
    """The quoted field name appears in a module of apps that is not its schema or hash."""
    pattern = re.compile(rf"[\"']{re.escape(name)}[\"']")
    for path in APPS.rglob("*.py"):
        if not any(part in str(path) for part in NOT_READERS) and pattern.search(path.read_text()):
            return True
    return False


def test_every_spec_field_is_acted_on_or_announced() -> None:
    for fields, acted, announced in (
        (SPEC_RUN_FIELDS, inert.REQUEST_ACTED, inert.REQUEST_INERT),
        (SPEC_AGENT_FIELDS, inert.AGENT_ACTED, inert.AGENT_INERT),
    ):
        assert fields - acted - set(announced) == set(), "neither acted on nor announced"
        assert not acted & set(announced), "a field is both"
    assert SPEC_RUN_FIELDS - set(RunCreateIn.model_fields) == set(), "a SPEC field the body drops unread"
    unread = sorted(f for f in inert.AGENT_ACTED if not _read_somewhere(f))
    assert unread == [], f"AGENT_ACTED fields no module reads: {unread}"


def _agent(name: str, overlay: dict[str, Any]) -> None:
    author = Author(tenant_id="", subject="ops", is_admin=True)
    def_create(
        get_kind("agent"), author, {"name": name, "overlay": {"provider": "mock", "model": "mock-script", **overlay}}
    )


def _create(agent: str, **kw: Any) -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text="hi")], user_id="alice", **kw)
    return services.run_create(principal=ALICE, data=data)


def _inert(run: Run) -> dict[str, dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run.id, type="capability_inert").order_by("seq")
    return {e.payload["capability_inert"]["gate"]: e.payload["capability_inert"] for e in rows}


@pytest.mark.usefixtures("agents", "no_workers")
def test_inert_fields_are_announced_at_run_start() -> None:
    _agent(
        "inert-rich",
        {
            "core_blocks": ["persona"],
            "memory_backend": "pg",
            "search_providers": ["brave"],
            "history_scope": ["self"],
            "compaction": {"enabled": True, "memory_flush": True},
        },
    )
    options = RunOptions(compaction={"memory_flush": True}, inert={"run_timeout_seconds": 30})
    found = _inert(_create("inert-rich", options=options))
    assert set(found) == {
        "core_blocks",
        "memory_backend",
        "compaction.memory_flush",
        "run_timeout_seconds",
    }  # fmt: skip  (search_providers: WebSearch's backends since issue 40; history_scope: History, issue 38)
    assert found["core_blocks"] == {
        "tool": "Memory",
        "gate": "core_blocks",
        "message": "core_blocks is set on the agent and not acted on: this runtime has no core memory blocks",
        "source": "agent",
    }
    assert found["run_timeout_seconds"]["source"] == "request"
    assert _inert(_create("echo")) == {}  # nothing inert, nothing said


@pytest.mark.usefixtures("agents", "no_workers")
def test_request_sampling_and_compaction_lay_over_the_agents_and_parent_context_is_kept() -> None:
    _agent("tuned", {"sampling": {"temperature": 0.7, "seed": 1}, "compaction": {"keep_last_n": 5}})
    lineage = {"root_agent_run_id": "r_root", "function_key": "fk", "board_lane": "b"}
    options = RunOptions(sampling={"temperature": 0.0, "top_p": 0.5}, compaction={"keep_first": True})
    run = _create("tuned", options=RunOptions(**{**options.__dict__, "parent_context": lineage}))
    assert run.routing["sampling"] == {"temperature": 0.0, "seed": 1, "top_p": 0.5}  # temperature 0 is kept
    assert run.routing["compaction"] == {"keep_last_n": 5, "keep_first": True}
    assert agent_out(Run.objects.get(id=run.id))["parent_context"] == lineage
    child = _create("echo", parent_id=run.id)  # a sub-agent inherits the lineage (SPEC 4.8)
    assert Run.objects.get(id=child.id).parent_context == lineage


@pytest.mark.usefixtures("agents")
def test_bad_options_are_400_and_good_ones_reach_the_run(http: httpx.Client) -> None:
    for body, where in (
        ({"sampling": {"temperature": 3}}, "temperature"),
        ({"sampling": {"top_q": 1}}, "top_q"),
        ({"sampling": {"stop": ["x"] * 17}}, "stop"),
        ({"compaction": {"keep_last_n": 0}}, "keep_last_n"),
        ({"parent_context": {"owner": "x"}}, "parent_context"),
        ({"web_search_filter": "sometimes"}, "web_search_filter"),
    ):
        reply = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True, **body})
        assert (reply.status_code, reply.json()["code"]) == (400, "invalid_body"), body
        assert where in reply.text
    sampling = {"temperature": 0, "stop": "a stop sequence longer than sixteen characters"}
    good = {"sampling": sampling, "parent_context": {"function_key": "fk"}, "web_search_filter": "drop"}
    reply = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True, **good})
    assert reply.status_code == 202, reply.text
    run = Run.objects.get(id=reply.json()["run_id"])
    assert (run.routing["sampling"], run.parent_context) == (sampling, {"function_key": "fk"})
    assert http.get(f"/v1/agents/{run.agent_id}").json()["parent_context"] == {"function_key": "fk"}
    assert set(_inert(run)) == set()  # web_search_filter is WebSearch's (issue 40): nothing inert
