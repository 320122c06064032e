"""The runs' part of a snapshot (apps.snapshots, SPEC 4.6 `paused_runs`):
every parked run (`paused` between iterations, or parked on input, children,
a channel or a human's answer) with its events, transcript, steering inputs,
tool-call records and interrupts. Runnable runs are left out: a snapshot is taken with the runtime
paused, when none should be left (a pause that timed out can leave some).

What a run may do is never taken from the file as written (its checksum is no
authentication): a run's tenant is its parent's when the parent travels with it,
and its tools, allowed hosts and routing are derived again here by the policy
functions a new run goes through (`_policy_here`), each at most what the file
says: a snapshot can narrow a run, never widen it.

Export reads; restore writes through apps.runs.store (the one writer of
runs_* tables). A run keeps its ids, session, step and counters, so it
continues where it stopped; its lease is cleared (no worker of this instance
holds it). A restored run whose parent is not in the snapshot becomes
top-level. A run is refused (400 `snapshot_invalid`) unless its ids are idents,
its JSON columns have the engine's shapes, and its def (mapped here) is of its
tenant or shared and of its agent name; its child rows take its tenant, user and
agent. Runs restored `paused` into a running runtime are resumed at once
(`paused_runs_resumed`); into a paused one they wait for `POST /v1/_resume`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import AutoField, Model, Q

from apps.core.errors import ApplicationError, Conflict, Invalid
from apps.core.hosts import run_allowed_hosts
from apps.core.ids import is_ident
from apps.core.rows import row_dump
from apps.core.toolregistry import resolve_volumes
from apps.gateway.resolver import resolve_route
from apps.runs import signals, store
from apps.runs.create import run_routing, run_tools
from apps.runs.dispatch import enqueue_iteration
from apps.runs.fanout_models import FanOut, FanOutSlot
from apps.runs.models import PARKED, ResidentChild, Run, RunStatus, RuntimeStateValue
from apps.runs.selectors import runtime_state
from apps.runs.store.snapshot import CHILD_TABLES
from apps.substrate.models import AgentDef

_MODES = ("ro", "rw")
_CLEARED: dict[str, Any] = {"lease_owner": "", "lease_until": None}  # worker state of the capturing instance


@dataclass(frozen=True)
class RunsRestored:
    paused_runs_restored: int
    paused_runs_resumed: int
    transcript_events_restored: int
    transcript_entries_restored: int
    run_inputs_restored: int
    tool_calls_restored: int
    interrupts_restored: int
    run_tenants: dict[str, str]  # the runs this restore wrote, with their tenants


class SnapshotUnresumable(Conflict):
    code = "snapshot_unresumable"


def paused_runs_export() -> list[dict[str, Any]]:
    """Every parked run, parents before children, each with its child rows. Refused (409
    `snapshot_unresumable`) while a run is tied to a fan-out join not yet complete or to an open
    resident child: those rows are not carried, and a run restored without them would never resume."""
    runs = list(Run.objects.filter(status__in=PARKED).order_by("depth", "created_at", "id"))
    ids = {run.id for run in runs}
    _refuse_unresumable(ids)
    children: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for key, model in CHILD_TABLES.items():
        for child in model.objects.filter(run_id__in=ids).order_by("run_id", "id").iterator():
            children[child.run_id][key].append(row_dump(child, exclude=_local_keys(model)))
    out = []
    for run in runs:
        row = {**row_dump(run), **_CLEARED}
        if row["parent_id"] not in ids:
            row["parent_id"] = None
        out.append({"run": row, **{key: children[run.id][key] for key in CHILD_TABLES}})
    return out


def _refuse_unresumable(ids: set[str]) -> None:
    """Raise when a run of `ids` is the parent or a child of an incomplete fan-out join (a batch's
    children included), or the parent or the run of an open resident child."""
    open_joins = FanOut.objects.filter(completed_at__isnull=True)
    tied = set(open_joins.filter(parent_run_id__in=ids).values_list("parent_run_id", flat=True))
    slots = FanOutSlot.objects.filter(fanout__completed_at__isnull=True, run_id__in=ids)
    tied |= {str(r) for r in slots.values_list("run_id", flat=True)}
    resident = ResidentChild.objects.filter(is_open=True).filter(Q(parent_id__in=ids) | Q(child_id__in=ids))
    for parent_id, child_id in resident.values_list("parent_id", "child_id"):
        tied |= {str(parent_id), str(child_id)} & ids
    if tied:
        shown = ", ".join(sorted(tied)[:5])
        raise SnapshotUnresumable(
            f"{len(tied)} parked run(s) wait on a fan-out or a resident child ({shown}); a snapshot does not "
            "carry those, so they could not resume: capture once they have ended",
            details={"run_ids": sorted(tied)[:100]},
        )


def _local_keys(model: type[Model]) -> tuple[str, ...]:
    """Columns a restore leaves to the target: the run (its parent entry says it), and a
    serial id, which is this instance's counter; a natural id (an interrupt's `intr_`) travels."""
    return ("id", "run_id") if isinstance(model._meta.pk, AutoField) else ("run_id",)


def _checked(
    entry: Any, def_ids: dict[str, str], run_ids: set[str], tenants: dict[str, str]
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """A snapshot entry as (run row with its def mapped here, its parent among `run_ids` or
    none, its policy derived here; child rows); refuses malformed ones and a run whose tenant
    is not its parent's (`tenants`: the tenants of the entries, by run id)."""
    run = entry.get("run") if isinstance(entry, dict) else None
    if not isinstance(run, dict) or not isinstance(run.get("id"), str) or not isinstance(run.get("depth", 0), int):
        raise Invalid("a paused_runs entry needs a run object with a string id", code="snapshot_invalid")
    if run.get("status") not in PARKED:
        raise Invalid(f"run {run['id']}: only parked runs are restored", code="snapshot_invalid")
    _check_ids(run)
    _check_shapes(run)
    rows = {key: entry.get(key, []) for key in CHILD_TABLES}
    if not all(isinstance(v, list) and all(isinstance(r, dict) for r in v) for v in rows.values()):
        raise Invalid(f"run {run['id']}: child rows must be lists of objects", code="snapshot_invalid")
    parent = run.get("parent_id")
    if parent in tenants and tenants[parent] != run.get("tenant_id", ""):
        raise Invalid(f"run {run['id']}: its tenant is not its parent's", code="snapshot_invalid")
    agent_def_id = _def_here(run, def_ids)
    parent_here = parent if parent in run_ids else None  # as export does: a parent not carried is not here
    return {
        **run,
        "volumes": _volumes_here(run),
        "agent_def_id": agent_def_id,
        "parent_id": parent_here,
        **_policy_here(run, agent_def_id, parent_here),
        **_CLEARED,
    }, rows


def _policy_here(run: dict[str, Any], agent_def_id: str, parent_id: str | None) -> dict[str, Any]:
    """The run's tools, allowed hosts and routing as run creation derives them on this instance
    (its operator floor, its def, the caller's narrowing the run kept), each within what the
    snapshot says: `*` hosts, a privileged tool or another routing in the file grant nothing."""
    row = AgentDef.objects.get(id=agent_def_id)
    d, caller = row.definition, run.get("caller_tools")
    caller_list = list(caller) if caller is not None else None
    derived = run_tools(agent_def=row, caller=caller_list, tenant_id=str(run.get("tenant_id", "")))
    kept = set(run.get("tools", []))
    hosts = set(run_allowed_hosts(run.get("allowed_hosts", [])))
    try:
        route = resolve_route(user_tier=(run.get("routing") or {}).get("user_tier") or None, agent=d)
    except ApplicationError as exc:
        raise Invalid(
            f"run {run['id']}: its agent cannot be routed here: {exc.message}", code="snapshot_invalid"
        ) from exc
    return {
        "tools": [name for name in derived if name in kept],
        "allowed_hosts": [h for h in run.get("allowed_hosts", []) if h in hosts],
        "routing": run_routing(route, d, parent_id=parent_id),
    }


def _volumes_here(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's volume bindings with this instance's directories: a host path is never taken
    from the file (the checksum is no authentication). Each named volume is bound again as
    run creation binds it (the volume resolver: yaml `volumes:` or the tenant's VolumeDefs),
    keeping the snapshot's mode, default flag and ephemeral root; a volume unknown here, or
    `ro` here where the run had `rw`, is a 400."""
    out = []
    for binding in run.get("volumes", []):
        if binding.get("ephemeral"):
            out.append({**binding, "path": ""})  # ephemeral ones live under this instance's volumes root
            continue
        spec = {"name": binding["name"], "mode": binding["mode"], "default": binding.get("default", False)}
        tenant_id = run.get("tenant_id", "")
        try:
            found = resolve_volumes(tenant_id=tenant_id, definition={"volumes": [spec]}, parent_id=None)
        except ApplicationError as exc:
            raise Invalid(
                f"run {run['id']}: volume {binding['name']!r} cannot be bound here: {exc.message}",
                code="snapshot_invalid",
                details={"run_id": run["id"], "volume": binding["name"]},
            ) from exc
        if len(found) != 1:  # no volume resolver in this build
            message = f"run {run['id']}: volume {binding['name']!r} is not configured here"
            raise Invalid(message, code="snapshot_invalid")
        here = found[0]
        out.append({**binding, "path": here["path"]})
    return out


def _check_ids(run: dict[str, Any]) -> None:
    """The run's id, agent id and parent id are idents (SPEC 2.0), its tenant "" or one."""
    ids = {"id": run["id"], "agent_id": run.get("agent_id")}
    if run.get("parent_id") is not None:
        ids["parent_id"] = run["parent_id"]
    if run.get("tenant_id", "") != "":
        ids["tenant_id"] = run["tenant_id"]
    for key, value in ids.items():
        if not isinstance(value, str) or not is_ident(value):
            raise Invalid(f"run {run['id']!r}: {key} must match [A-Za-z0-9_-]{{1,128}}", code="snapshot_invalid")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _volume(value: Any) -> bool:
    """One binding as VolumeBinding.as_dict() writes it (apps.core.tools)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or value.get("mode", "ro") not in _MODES:
        return False
    texts = all(isinstance(value.get(k, ""), str) for k in ("path", "root_run_id"))
    return texts and all(isinstance(value.get(k, False), bool) for k in ("default", "ephemeral"))


def _check_shapes(run: dict[str, Any]) -> None:
    """The JSON columns the engine reads have the shapes run creation gives them
    (apps.runs.services): `tools` and `allowed_hosts` lists of strings, `caller_tools`
    none or one, `volumes` a list of bindings."""
    bad = [
        key
        for key, ok in (
            ("tools", _strings(run.get("tools", []))),
            ("allowed_hosts", _strings(run.get("allowed_hosts", []))),
            ("caller_tools", run.get("caller_tools") is None or _strings(run.get("caller_tools"))),
            ("volumes", isinstance(run.get("volumes", []), list) and all(map(_volume, run.get("volumes", [])))),
        )
        if not ok
    ]
    if bad:
        raise Invalid(
            f"run {run['id']}: {', '.join(bad)} not as the engine keeps them (lists of strings; volume bindings)",
            code="snapshot_invalid",
            details={"run_id": run["id"], "fields": bad},
        )


def _def_here(run: dict[str, Any], def_ids: dict[str, str]) -> str:
    """The def of this instance `run` pins: its snapshot def mapped, or the same id here; either
    way of the run's tenant (or shared, "") and of the run's agent name, else 400."""
    pinned = str(run.get("agent_def_id"))
    mapped = def_ids.get(pinned, pinned)
    found = AgentDef.objects.filter(id=mapped).values_list("tenant_id", "name").first()
    if found is None:
        raise Invalid(
            f"run {run['id']} pins agent def {pinned}, in neither the snapshot nor here", code="snapshot_invalid"
        )
    if found[0] not in ("", run.get("tenant_id", "")) or found[1] != run.get("agent_name"):
        raise Invalid(
            f"run {run['id']} pins agent def {pinned}, which is not its tenant's agent {run.get('agent_name')!r}",
            code="snapshot_invalid",
        )
    return mapped


def paused_runs_restore(entries: list[Any], *, def_ids: dict[str, str]) -> RunsRestored:
    """Inside the restore's transaction: every run not already here, whole; paused
    ones resumed on commit when the runtime is running."""
    runs = [e["run"] for e in entries if isinstance(e, dict) and isinstance(e.get("run"), dict)]
    run_ids = {r.get("id") for r in runs}
    entry_tenants = {str(r.get("id")): str(r.get("tenant_id", "")) for r in runs}
    ordered = sorted(entries, key=_depth)  # parents first: a child's compaction routing reads its parent's
    checked = [_checked(e, def_ids, run_ids, entry_tenants) for e in ordered]
    totals: dict[str, int] = defaultdict(int)
    written: list[tuple[str, str]] = []
    tenants: dict[str, str] = {}
    for run, rows in checked:
        done = store.run_restore(run=run, children=rows)
        if done.run:
            written.append((run["id"], str(run.get("status"))))
            tenants[run["id"]] = str(run.get("tenant_id", ""))
            for key in CHILD_TABLES:
                totals[key] += getattr(done, key)
    return RunsRestored(
        paused_runs_restored=len(written),
        paused_runs_resumed=_resume_if_running([r for r, status in written if status == RunStatus.PAUSED]),
        transcript_events_restored=totals["events"],
        transcript_entries_restored=totals["transcript"],
        run_inputs_restored=totals["inputs"],
        tool_calls_restored=totals["tool_calls"],
        interrupts_restored=totals["interrupts"],
        run_tenants=tenants,
    )


def _depth(entry: Any) -> int:
    run = entry.get("run") if isinstance(entry, dict) else None
    depth = run.get("depth", 0) if isinstance(run, dict) else 0
    return depth if isinstance(depth, int) else 0


def _resume_if_running(paused: list[str]) -> int:
    """With the runtime running, the restored paused runs continue (their doorbells go out on commit)."""
    if not paused or runtime_state() != RuntimeStateValue.RUNNING:
        return 0
    resumed = store.runs_resume_restored(paused)
    transaction.on_commit(lambda: _enqueue_all(resumed))
    for run_id, _step in resumed:
        signals.send_on_commit(signals.run_resumed, run_id=run_id)
    return len(resumed)


def _enqueue_all(doorbells: list[tuple[str, int]]) -> None:
    for run_id, step in doorbells:
        enqueue_iteration(run_id, step)
