"""Snapshots in-process (SPEC 2.4, 4.6): the envelope's checks, memory with
its embedding, evaluations, the size cap, and the REST surface. Moving paused
runs between two instances is tests/snapshots/test_cross_instance.py."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client

from apps.core.errors import Invalid
from apps.evaluations.models import Evaluation
from apps.memory.models import EMBEDDING_DIMENSIONS, MemoryEntry
from apps.runs import store
from apps.runs.models import RuntimeStateValue
from apps.snapshots import errors, services
from apps.snapshots.envelope import canonical, checksum_of
from apps.substrate import tokens
from apps.substrate.kinds import get_kind
from apps.substrate.models import AgentDef
from apps.substrate.services import Author, def_create

VECTOR = [(i % 7) / 8 - 0.25 for i in range(EMBEDDING_DIMENSIONS)]  # exact in float32


def _set_state(state: str) -> None:
    with transaction.atomic():
        store.runtime_state_lock()  # creates the row when missing
        store.runtime_state_set(state)


@pytest.fixture
def paused(db: None) -> Iterator[None]:
    _set_state(RuntimeStateValue.PAUSED)
    yield
    _set_state(RuntimeStateValue.RUNNING)


def _seed() -> None:
    MemoryEntry.objects.create(tenant_id="acme", scope="tenant", key="plan", value={"step": 3}, embedding=VECTOR)
    Evaluation.objects.create(
        eval_id="eval_0123456789abcdef",
        tenant_id="acme",
        run_id="r_0123456789abcdef",
        def_id="def_0123456789abcdef",
        agent_name="scripted",
        score=0.75,
        emitter_role="external",
    )


def _envelope(**kw: Any) -> dict[str, Any]:
    envelope: dict[str, Any] = json.loads(services.snapshot_capture(**kw).content)
    return envelope


def test_a_running_runtime_is_captured_without_runs(db: None) -> None:
    _seed()
    capture = services.snapshot_take(label="live")
    assert (capture.runtime_state, capture.runs_captured, capture.runs_left_out) == ("running", 0, 0)
    sections = json.loads(capture.row.content)["sections"]
    assert sections["paused_runs"]["rows"] == [] and len(sections["memory"]["rows"]) == 1


def test_memory_and_evaluations_come_back_whole_and_a_second_restore_writes_nothing(paused: None) -> None:
    _seed()
    envelope = _envelope(label="unit")
    assert set(envelope["sections"]) == {
        "agent_defs",
        "agent_def_active",
        "memory",
        "channels",
        "paused_runs",
        "evaluations",
    }
    assert set(services.snapshot_restore(envelope=envelope).values()) == {0}  # everything is here already
    MemoryEntry.objects.filter(key="plan").delete()
    Evaluation.objects.all().delete()
    counts = services.snapshot_restore(envelope=envelope)
    assert (counts["memory_restored"], counts["evaluations_restored"]) == (1, 1)
    entry = MemoryEntry.objects.get(tenant_id="acme", key="plan")
    assert entry.value == {"step": 3} and list(entry.embedding or []) == VECTOR
    assert Evaluation.objects.get(eval_id="eval_0123456789abcdef").score == 0.75
    assert set(services.snapshot_restore(envelope=envelope).values()) == {0}


def test_a_capture_past_its_cap_is_refused_and_stores_nothing(paused: None) -> None:
    for n in range(20):
        MemoryEntry.objects.create(tenant_id="acme", scope="tenant", key=f"k{n}", value="x" * 200)
    with pytest.raises(errors.SnapshotTooLarge) as refused:
        services.snapshot_capture(max_bytes=2048)
    assert (refused.value.status, refused.value.code) == (413, "snapshot_too_large")
    assert refused.value.details == {"max_bytes": 2048}


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda e: e["sections"]["memory"].update(version="2.0"), "snapshot_version_too_new"),
        (lambda e: e.update(schema_version="1.9"), "snapshot_version_too_new"),
        (lambda e: e["sections"]["memory"].update(version="one"), "snapshot_version_unknown"),
        (
            lambda e: e["sections"].update(interaction_history={"version": "1.0", "rows": []}),
            "snapshot_version_unknown",
        ),
    ],
)
def test_versions_this_build_cannot_read_are_refused_before_anything_is_written(
    paused: None, edit: Any, code: str
) -> None:
    _seed()
    envelope = _envelope()
    MemoryEntry.objects.all().delete()
    edit(envelope)
    envelope["checksum"] = checksum_of(canonical(envelope["sections"]))
    with pytest.raises((errors.SnapshotVersionTooNew, errors.SnapshotVersionUnknown)) as refused:
        services.snapshot_restore(envelope=envelope)
    assert (refused.value.status, refused.value.code) == (422, code)
    assert not MemoryEntry.objects.exists()


def test_a_changed_row_fails_the_checksum(paused: None) -> None:
    _seed()
    envelope = _envelope()
    envelope["sections"]["memory"]["rows"][0]["value"] = {"step": 4}
    with pytest.raises(errors.SnapshotChecksumMismatch):
        services.snapshot_restore(envelope=envelope)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "memory.MemoryEntry row has unknown fields ['colour']"),
        ({"key": {"a": 1}}, "key: dict where CharField belongs"),
        ({"scope_id": None}, "scope_id may not be null"),
        ({"created_at": "yesterday"}, "created_at: not a timestamp"),
        ({"embedding": "bm90IDM4NCBmbG9hdHM="}, "memory embedding must hold 384 float32s"),
    ],
)
def test_a_malformed_row_is_a_400_and_nothing_is_written(paused: None, change: dict[str, Any], message: str) -> None:
    _seed()
    envelope = _envelope()
    MemoryEntry.objects.all().delete()
    envelope["sections"]["memory"]["rows"][0].update(change)
    envelope["checksum"] = checksum_of(canonical(envelope["sections"]))
    with pytest.raises(Invalid) as refused:
        services.snapshot_restore(envelope=envelope)
    assert (refused.value.status, refused.value.code, refused.value.message) == (400, "snapshot_invalid", message)
    assert not MemoryEntry.objects.exists()


def test_rest_capture_list_get_export_restore_delete(transactional_db: None, paused: None, client: Client) -> None:
    """Committed rows: the bearer check reads tokens on its own thread and connection."""
    admin = {"Authorization": f"Bearer {tokens.token_create(name='ops', tenant_id='ops')['token']}"}
    member = tokens.token_create(name="alice", tenant_id="acme", subject="alice", scopes=["substrate:tenant"])
    body = {"label": "nightly"}
    refused = client.post(
        "/v1/_snapshots", body, "application/json", headers={"Authorization": f"Bearer {member['token']}"}
    )
    assert refused.status_code == 403
    created = client.post("/v1/_snapshots", body, "application/json", headers=admin)
    assert created.status_code == 201
    meta = created.json()
    assert meta["created_at"].endswith("Z") and len(meta["created_at"]) == len("2026-01-01T00:00:00.000Z")
    listed = client.get("/v1/_snapshots", {"label_contains": "night"}, headers=admin).json()["entries"]
    live = {"runtime_state": "paused", "runs_captured": 0, "runs_left_out": 0}
    assert listed == [{k: v for k, v in meta.items() if k not in live}] and {k: meta[k] for k in live} == live
    assert client.get("/v1/_snapshots", {"label_contains": "weekly"}, headers=admin).json() == {"entries": []}
    got = client.get(f"/v1/_snapshots/{meta['id']}", headers=admin).json()
    exported = client.get(f"/v1/_snapshots/{meta['id']}/export", headers=admin)
    assert got["envelope"] == json.loads(exported.content) and got["id"] == meta["id"]
    restored = client.post(f"/v1/_snapshots/{meta['id']}/restore", {}, "application/json", headers=admin)
    assert restored.status_code == 200 and set(restored.json().values()) == {0}
    history = client.post(
        f"/v1/_snapshots/{meta['id']}/restore", {"include_history": True}, "application/json", headers=admin
    )
    assert (history.status_code, history.json()["code"]) == (400, "invalid_body")
    assert client.delete(f"/v1/_snapshots/{meta['id']}", headers=admin).status_code == 204
    gone = client.get(f"/v1/_snapshots/{meta['id']}", headers=admin)
    assert (gone.status_code, gone.json()["code"]) == (404, "snapshot_not_found")
    assert client.delete(f"/v1/_snapshots/{meta['id']}", headers=admin).status_code == 404


def test_manage_py_snapshot_moves_an_envelope_through_a_file(paused: None, tmp_path: Path) -> None:
    _seed()
    row = services.snapshot_capture(label="to a file")
    call_command("snapshot", "export", row.id, str(tmp_path / "snap.json"))
    assert (tmp_path / "snap.json").read_text() == row.content
    MemoryEntry.objects.all().delete()
    out = io.StringIO()
    call_command("snapshot", "restore", str(tmp_path / "snap.json"), stdout=out)
    assert json.loads(out.getvalue())["memory_restored"] == 1
    (tmp_path / "bad.json").write_text(row.content.replace('"sha256:', '"sha256:0'))
    with pytest.raises(CommandError, match="snapshot_checksum_mismatch"):
        call_command("snapshot", "restore", str(tmp_path / "bad.json"))


def test_a_def_unknown_here_keeps_its_id_at_the_next_free_version_and_the_pointer_here_wins(paused: None) -> None:
    author = Author(tenant_id="acme", subject="ops", is_admin=True)
    created = def_create(
        get_kind("agent"), author, {"name": "mover", "overlay": {"provider": "mock", "model": "mock-script"}}
    )
    envelope = _envelope()
    (row,) = [r for r in envelope["sections"]["agent_defs"]["rows"] if r["id"] == created["def_id"]]
    # The same name and version, another content and id: as another instance's own edit would be.
    twin = {**row, "id": "def_00000000000000aa", "content_sha256": "sha256:" + "0" * 64}
    envelope["sections"]["agent_defs"]["rows"].append(twin)
    envelope["checksum"] = checksum_of(canonical(envelope["sections"]))
    counts = services.snapshot_restore(envelope=envelope)
    assert (counts["agent_defs_restored"], counts["agent_def_active_restored"]) == (1, 0)
    restored = AgentDef.objects.get(id="def_00000000000000aa")
    assert (restored.tenant_id, restored.name, restored.version) == ("acme", "mover", row["version"] + 1)
    assert services.snapshot_restore(envelope=envelope)["agent_defs_restored"] == 0


@pytest.mark.usefixtures("agents", "no_workers")
def test_a_run_parked_on_a_question_moves_with_its_interrupt() -> None:
    """A run at `awaiting_interrupt` keeps its interrupt (the same `intr_` id, still pending) through a restore."""
    from apps.runs import engine
    from apps.runs.models import Interrupt, InterruptStatus, Run, RunStatus
    from tests.factories.runs import ask_run

    run = ask_run()
    engine.run_iterate(run_id=run.id, step=0)
    asked = Interrupt.objects.get(run_id=run.id)
    assert Run.objects.get(id=run.id).status == RunStatus.AWAITING_INTERRUPT
    _set_state(RuntimeStateValue.PAUSED)
    try:
        envelope = _envelope(label="question")
        Run.objects.filter(id=run.id).delete()  # gone here, as on an empty instance
        Interrupt.objects.filter(id=asked.id).delete()
        counts = services.snapshot_restore(envelope=envelope)
    finally:
        _set_state(RuntimeStateValue.RUNNING)
    assert (counts["paused_runs_restored"], counts["interrupts_restored"]) == (1, 1)
    back = Interrupt.objects.get(id=asked.id)
    assert (back.run_id, back.status, back.question, back.options) == (
        run.id,
        InterruptStatus.PENDING,
        asked.question,
        asked.options,
    )
    assert Run.objects.get(id=run.id).status == RunStatus.AWAITING_INTERRUPT


def test_an_evaluation_follows_its_def_to_this_instances_id(paused: None) -> None:
    """The capturing instance's def id is mapped to the twin def here (same tenant, name, content)."""
    author = Author(tenant_id="acme", subject="ops", is_admin=True)
    created = def_create(
        get_kind("agent"), author, {"name": "scored", "overlay": {"provider": "mock", "model": "mock-script"}}
    )
    envelope = _envelope()
    rows = envelope["sections"]
    (row,) = [r for r in rows["agent_defs"]["rows"] if r["id"] == created["def_id"]]
    row["id"] = "def_00000000000000dd"  # the id the other instance minted for the same def
    rows["evaluations"]["rows"] = [
        {
            "eval_id": "eval_00000000000000ee",
            "tenant_id": "acme",
            "run_id": "r_0123456789abcdef",
            "def_id": "def_00000000000000dd",
            "agent_name": "scored",
            "score": 0.5,
            "emitter_role": "external",
        }
    ]
    envelope["checksum"] = checksum_of(canonical(rows))
    assert services.snapshot_restore(envelope=envelope)["evaluations_restored"] == 1
    assert Evaluation.objects.get(eval_id="eval_00000000000000ee").def_id == created["def_id"]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot read"),  # no such file
        (b"{not json", "invalid_json: bad json"),
        (b"\xff\xfe", "invalid_json: bad json"),
        (b'{"format": "loomcycle-snapshot", "x": "nul\\u0000"}', "invalid_body"),
    ],
)
def test_manage_py_snapshot_restore_turns_a_bad_file_into_a_command_error(
    db: None, tmp_path: Path, content: bytes | None, error: str
) -> None:
    file = tmp_path / "in.json"
    if content is not None:
        file.write_bytes(content)
    with pytest.raises(CommandError, match=error):
        call_command("snapshot", "restore", str(file))
