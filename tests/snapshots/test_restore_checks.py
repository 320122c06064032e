"""A restore ties every row to its run (review findings on snapshots): child rows take
the run's tenant, user and agent; a parent not carried becomes none; a run may pin only
a def of its own tenant (or shared) and of its own agent name; a channel wait may wait
only on its tenant's channels. In-process (the engine parks the run here)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction

from apps.core.errors import Conflict, Invalid
from apps.runs import engine, store
from apps.runs.models import Interrupt, Run, RuntimeStateValue
from apps.runs.prompt import Segment
from apps.runs.selectors import runtime_state
from apps.runs.services import RunCreate, run_create, runtime_pause_start
from apps.runs.snapshot import SnapshotUnresumable
from apps.snapshots import services
from apps.snapshots.envelope import canonical, checksum_of
from apps.snapshots.errors import RunsNotParked
from tests.conftest import ALICE
from tests.factories.runs import ask_run

pytestmark = pytest.mark.usefixtures("agents", "no_workers")


def _set_state(state: str) -> None:
    with transaction.atomic():
        store.runtime_state_lock()
        store.runtime_state_set(state)


@dataclass
class Captured:
    run: Run
    envelope: dict[str, Any]

    def edited(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A deep copy of the envelope and its one paused_runs entry, to edit."""
        moved = copy.deepcopy(self.envelope)
        (entry,) = moved["sections"]["paused_runs"]["rows"]
        return moved, entry

    def restore(self, envelope: dict[str, Any]) -> dict[str, int]:
        """Restore `envelope` (checksum recomputed) with the run gone here first."""
        envelope["checksum"] = checksum_of(canonical(envelope["sections"]))
        Run.objects.filter(id=self.run.id).delete()
        Interrupt.objects.filter(run_id=self.run.id).delete()
        return services.snapshot_restore(envelope=envelope)


@pytest.fixture
def captured() -> Iterator[Captured]:
    """A run of tenant "" parked on a question, captured with the runtime paused."""
    run = ask_run()
    engine.run_iterate(run_id=run.id, step=0)
    _set_state(RuntimeStateValue.PAUSED)
    try:
        yield Captured(run, json.loads(services.snapshot_capture(label="checks").content))
    finally:
        _set_state(RuntimeStateValue.RUNNING)


def test_child_rows_take_the_runs_tenant_user_and_agent(captured: Captured) -> None:
    envelope, entry = captured.edited()
    entry["interrupts"][0].update(tenant_id="globex", user_id="mallory", agent_id="a_someone_else", agent_name="x")
    assert captured.restore(envelope)["interrupts_restored"] == 1
    back = Interrupt.objects.get(run_id=captured.run.id)
    assert (back.tenant_id, back.user_id, back.agent_id, back.agent_name) == ("", "u1", captured.run.agent_id, "asker")


def test_a_parent_not_in_the_snapshot_is_dropped(captured: Captured) -> None:
    _set_state(RuntimeStateValue.RUNNING)
    other = ask_run()  # here, runnable, not in the snapshot
    envelope, entry = captured.edited()
    entry["run"]["parent_id"] = other.id
    assert captured.restore(envelope)["paused_runs_restored"] == 1
    assert Run.objects.get(id=captured.run.id).parent_id is None


def _def_row(envelope: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in envelope["sections"]["agent_defs"]["rows"] if r["name"] == name)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda row: {**row, "id": "def_00000000000000bb", "tenant_id": "globex"}, id="another-tenant"),
        pytest.param(lambda row: {**row, "id": "def_00000000000000cc", "name": "not-asker"}, id="another-name"),
    ],
)
def test_a_run_may_pin_only_its_tenants_def_of_its_agent(captured: Captured, edit: Any) -> None:
    envelope, entry = captured.edited()
    foreign = edit({**_def_row(envelope, "asker"), "content_sha256": "sha256:" + "1" * 64, "parent_id": None})
    envelope["sections"]["agent_defs"]["rows"].append(foreign)
    entry["run"]["agent_def_id"] = foreign["id"]
    with pytest.raises(Invalid) as refused:
        captured.restore(envelope)
    assert (refused.value.status, refused.value.code) == (400, "snapshot_invalid")
    assert "which is not its tenant's agent 'asker'" in refused.value.message
    assert not Run.objects.filter(id=captured.run.id).exists()


def test_a_wait_on_another_tenants_channel_is_refused(captured: Captured) -> None:
    envelope, _entry = captured.edited()
    channels = envelope["sections"]["channels"]["rows"]
    channels["defs"].append({"tenant_id": "globex", "name": "globex-secrets", "scope": "global", "source": "runtime"})
    channels["waits"].append(
        {
            "run_id": captured.run.id,
            "call_id": "call_w",
            "tenant_id": "globex",
            "op": "subscribe",
            "streams": ["globex-secrets\x1fglobal\x1f"],
            "request": {},
            "deadline": "2099-01-01T00:00:00+00:00",
            "wake_at": "2099-01-01T00:00:00+00:00",
            "created_at": "2026-01-01T00:00:00+00:00",
        }
    )
    with pytest.raises(Invalid) as refused:
        captured.restore(envelope)
    assert (refused.value.code, refused.value.details["channels"]) == ("snapshot_invalid", ["globex-secrets"])
    assert not Run.objects.filter(id=captured.run.id).exists()


def test_a_run_whose_agent_id_is_taken_here_is_a_409_not_a_silent_skip(captured: Captured) -> None:
    envelope, entry = captured.edited()
    entry["run"]["id"] = "r_00000000000000ff"  # the same (agent_id, tenant) as the run still here
    entry["interrupts"] = []
    envelope["checksum"] = checksum_of(canonical(envelope["sections"]))
    with pytest.raises(Conflict) as refused:
        services.snapshot_restore(envelope=envelope)
    assert (refused.value.status, refused.value.code) == (409, "snapshot_conflict")
    assert refused.value.details["run_id"] == "r_00000000000000ff"
    assert "r_00000000000000ff" in refused.value.message
    assert not Run.objects.filter(id="r_00000000000000ff").exists()
    assert set(services.snapshot_restore(envelope=captured.envelope).values()) == {0}  # a known id: skipped


def test_a_capture_of_the_running_runtime_carries_no_runs_and_counts_the_live_ones() -> None:
    """As loomcycle, a running runtime is captured (it carries only paused runs: none); the
    answer says which state it read and how many live runs the snapshot does not carry."""
    parked = ask_run()
    engine.run_iterate(run_id=parked.id, step=0)  # parked on its question
    ask_run()  # queued: no worker claims it here
    assert runtime_state() == RuntimeStateValue.RUNNING
    capture = services.snapshot_take(label="live")
    assert (capture.runtime_state, capture.runs_captured, capture.runs_left_out) == ("running", 0, 2)
    envelope = json.loads(capture.row.content)
    assert envelope["sections"]["paused_runs"]["rows"] == []
    assert envelope["sections"]["agent_defs"]["rows"]  # the rest of the picture is there
    _set_state(RuntimeStateValue.PAUSING)  # a pause under way: still a live capture
    try:
        assert services.snapshot_take(label="pausing").runtime_state == "pausing"
    finally:
        _set_state(RuntimeStateValue.RUNNING)


def test_capture_refuses_while_a_run_is_still_runnable() -> None:
    """After a pause that timed out a run can still be queued or running: no capture then."""
    ask_run()  # queued: no worker claims it here
    _set_state(RuntimeStateValue.PAUSED)
    try:
        with pytest.raises(RunsNotParked) as refused:
            services.snapshot_capture(label="too early")
    finally:
        _set_state(RuntimeStateValue.RUNNING)
    assert (refused.value.status, refused.value.code, refused.value.details) == (
        409,
        "runs_not_parked",
        {"runnable_runs": 1},
    )
    assert "1 run(s) are still queued or running" in refused.value.message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e["interrupts"][0].update(status="bogus"), "status: 'bogus' is not one of its choices"),
        (lambda e: e["run"].update(agent_id="a b"), "agent_id must match [A-Za-z0-9_-]{1,128}"),
        (lambda e: e["run"].update(tenant_id="acme/x"), "tenant_id must match [A-Za-z0-9_-]{1,128}"),
        (lambda e: e["run"].update(tools="Read"), "tools not as the engine keeps them"),
        (lambda e: e["run"].update(allowed_hosts=[1]), "allowed_hosts not as the engine keeps them"),
        (lambda e: e["run"].update(volumes=[{"name": "v", "mode": "all"}]), "volumes not as the engine keeps them"),
        (lambda e: e["run"].update(volumes={"name": "v"}), "volumes not as the engine keeps them"),
    ],
)
def test_a_row_the_engine_could_not_use_is_a_400(captured: Captured, edit: Any, message: str) -> None:
    envelope, entry = captured.edited()
    edit(entry)
    with pytest.raises(Invalid) as refused:
        captured.restore(envelope)
    assert (refused.value.status, refused.value.code) == (400, "snapshot_invalid")
    assert message in refused.value.message
    assert not Run.objects.filter(id=captured.run.id).exists()


def test_what_a_run_may_do_is_derived_here_never_taken_from_the_file(captured: Captured) -> None:
    """Issue 33, item 12: tools, allowed hosts and routing go through a new run's policy
    functions on restore, within what the file says; the file's widening grants nothing."""
    before = Run.objects.get(id=captured.run.id)
    envelope, entry = captured.edited()
    entry["run"]["tools"] = [*before.tools, "Bash", "HTTP", "WebFetch"]
    entry["run"]["allowed_hosts"] = ["*", "169.254.169.254"]
    entry["run"]["routing"] = {**before.routing, "candidates": [{"provider": "anthropic", "model": "claude-x"}]}
    captured.restore(envelope)
    after = Run.objects.get(id=captured.run.id)
    assert after.tools == before.tools and "Bash" not in after.tools
    assert after.allowed_hosts == []  # this instance's operator lists no host: `*` is not one
    assert after.routing == before.routing
    narrowed, entry = captured.edited()
    entry["run"]["tools"] = before.tools[:1]  # a file may narrow a run
    captured.restore(narrowed)
    assert Run.objects.get(id=captured.run.id).tools == before.tools[:1]


def test_a_child_whose_tenant_is_not_its_parents_is_a_400(captured: Captured) -> None:
    envelope, entry = captured.edited()
    child = copy.deepcopy(entry)
    child["run"].update(id="r_child00000000001", agent_id="a_child00000000001", parent_id=captured.run.id)
    child["run"].update(depth=1, tenant_id="acme")
    child.update(interrupts=[], events=[], transcript=[], inputs=[], tool_calls=[])
    envelope["sections"]["paused_runs"]["rows"].append(child)
    with pytest.raises(Invalid, match="its tenant is not its parent's"):
        captured.restore(envelope)
    assert not Run.objects.filter(id__in=[captured.run.id, "r_child00000000001"]).exists()


def _binding(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "path": path, "mode": "rw", "default": True, "ephemeral": False, "root_run_id": ""}


def test_a_volume_is_bound_to_this_instances_directory_never_the_files_path(captured: Captured) -> None:
    envelope, entry = captured.edited()
    entry["run"]["volumes"] = [_binding("work", "/etc")]  # the checksum is recomputed: no authentication
    captured.restore(envelope)
    (bound,) = Run.objects.get(id=captured.run.id).volumes
    assert bound["path"] != "/etc" and bound["path"].endswith("/volumes-static/work")


def test_a_volume_unknown_here_is_a_400(captured: Captured) -> None:
    envelope, entry = captured.edited()
    entry["run"]["volumes"] = [_binding("nowhere", "/srv/nowhere")]
    with pytest.raises(Invalid) as refused:
        captured.restore(envelope)
    assert (refused.value.status, refused.value.code) == (400, "snapshot_invalid")
    assert "volume 'nowhere' cannot be bound here" in refused.value.message
    assert not Run.objects.filter(id=captured.run.id).exists()


def _fan_parent() -> str:
    steps = [{"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": [fan_child("a"), fan_child("b")]}}]
    return run_create(principal=ALICE, data=RunCreate(agent="fanner", segments=[Segment(text=mock(steps))])).id


def _resident_parent() -> str:
    steps = [{"tool": "Agent", "input": {"op": "open", "name": "resident-child", "prompt": mock([{"text": "hi"}])}}]
    data = RunCreate(agent="resident-parent", segments=[Segment(text=mock(steps))], interactive=True)
    return run_create(principal=ALICE, data=data).id


def fan_child(text: str) -> dict[str, Any]:
    return {"name": "fan-child", "prompt": mock([{"text": text}])}


def mock(steps: list[dict[str, Any]]) -> str:
    return f"MOCK_SCRIPT: {json.dumps(steps)}"


@pytest.mark.parametrize("make_parent", [_fan_parent, _resident_parent])
def test_capture_refuses_runs_tied_to_a_fanout_or_a_resident_child(make_parent: Any) -> None:
    """Their join / resident rows are not carried: exported, they could never resume."""
    parent_id = make_parent()
    assert engine.run_iterate(run_id=parent_id, step=0) == engine.Outcome.PARK  # its children are queued
    runtime_pause_start()  # parks the unleased children `paused`: nothing runnable is left
    try:
        assert runtime_state() == RuntimeStateValue.PAUSED
        with pytest.raises(SnapshotUnresumable) as refused:
            services.snapshot_capture(label="mid fan-out")
    finally:
        _set_state(RuntimeStateValue.RUNNING)
    assert (refused.value.status, refused.value.code) == (409, "snapshot_unresumable")
    kids = set(Run.objects.filter(parent_id=parent_id).values_list("id", flat=True))
    assert set(refused.value.details["run_ids"]) == {parent_id, *kids}
