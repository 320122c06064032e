"""Volumes: where a run may touch the filesystem (SPEC 6.9, 5.2 VolumeDef).

Three sources, one shape (`apps.core.tools.VolumeBinding` on the run row):
- static: yaml `volumes: {name: {path, mode, default, dynamic_root, tenants}}`, shared by every
  tenant, or by those `tenants` lists (an entry marked dynamic_root is the volumes root, never
  bindable); none may reach the data directory's own entries or the checkout;
- dynamic: a tenant's `VolumeDef` row, a directory under the volumes root;
- ephemeral: an agent binding `{name, ephemeral: true}`, a directory per top-level
  run under `<root>/ephemeral/<root_run_id>/`, made on first use and purged when
  that run ends (apps.tools.apps hooks `registry.on_run_finished`).

Invariants:
- An agent that binds nothing has no filesystem; an unknown volume name refuses the run.
- A binding may narrow a volume's mode (rw -> ro), never widen it.
- A sub-agent's bindings are its own definition's within its parent's: same
  volume and path, mode the narrower of the two; anything else is dropped.
- Volumes live on the filesystem of the worker that runs the tool: a worker that
  lacks a volume's directory answers is_error naming the volume and the path.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.core.config import runtime_config
from apps.core.errors import Conflict, Invalid
from apps.core.tools import ToolContext, VolumeBinding
from apps.tools import errors
from apps.tools.volume_places import check_apart, check_private

log = logging.getLogger("loomcycle.tools")

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MODES = ("ro", "rw")


@dataclass(frozen=True)
class StaticVolume:
    name: str
    path: str
    mode: str
    default: bool = False
    tenants: tuple[str, ...] | None = None  # None: every tenant may bind it

    def bindable_by(self, tenant_id: str) -> bool:
        """The shared tenant (the operator's own runs) always; a tenant when no list names the tenants."""
        return not tenant_id or self.tenants is None or tenant_id in self.tenants


class VolumeUnavailable(Exception):
    """A tool cannot use a volume (none bound, unknown name, missing directory); the text is the is_error."""


def check_name(name: Any, where: str = "volume") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise Invalid(
            f"{where}: name must match [a-z0-9][a-z0-9_-]{{0,63}} (got {name!r})", code=errors.VOLUME_NAME_INVALID
        )
    return name


def check_mode(mode: Any, where: str = "volume") -> str:
    if mode not in MODES:
        raise Invalid(f"{where}: mode must be ro or rw (got {mode!r})", code=errors.VOLUME_MODE_INVALID)
    return str(mode)


# --- static (yaml) -----------------------------------------------------------------


def _static_entry(name: Any, raw: Any) -> StaticVolume:
    where = f"volumes.{name}"
    check_name(name, where)
    if not isinstance(raw, dict):
        raise Invalid(f"{where}: must be a mapping with path and mode", code="config_invalid")
    path = raw.get("path")
    if not isinstance(path, str) or not Path(path).is_absolute():
        raise Invalid(f"{where}: path must be an absolute directory path (got {path!r})", code="config_invalid")
    mode = check_mode(raw.get("mode", "ro"), where)
    tenants = raw.get("tenants")
    if tenants is not None and (
        not isinstance(tenants, list) or not all(isinstance(t, str) and TENANT_RE.fullmatch(t) for t in tenants)
    ):
        raise Invalid(f"{where}: tenants must be a list of tenant ids (got {tenants!r})", code="config_invalid")
    return StaticVolume(
        name=str(name),
        path=str(Path(path)),
        mode=mode,
        default=bool(raw.get("default")),
        tenants=tuple(tenants) if tenants is not None else None,
    )


def static_volumes(config: dict[str, Any] | None = None) -> dict[str, StaticVolume]:
    """The bindable yaml `volumes:` entries; raises Invalid(config_invalid).
    An entry marked `dynamic_root: true` is checked but never bindable: its directory
    holds every tenant's dynamic volumes and every run's ephemeral ones. A bindable
    entry whose path contains the volumes root or sits inside it is refused (it would
    reach those directories too), and so is one that reaches the runtime's own places
    (apps.tools.volume_places)."""
    config = runtime_config() if config is None else config
    block = config.get("volumes") or {}
    if not isinstance(block, dict):
        raise Invalid("`volumes:` must be a mapping of name -> {path, mode}", code="config_invalid")
    entries = {str(name): _static_entry(name, raw) for name, raw in block.items()}
    bindable = {n: v for n, v in entries.items() if not (isinstance(block[n], dict) and block[n].get("dynamic_root"))}
    root = volumes_root(config)
    for volume in bindable.values():
        if root is not None:
            check_apart(volume.name, volume.path, Path(os.path.realpath(root)))
        check_private(volume.name, volume.path)
    return bindable


NO_ROOT = (
    "dynamic and ephemeral volumes are not configured on this runtime "
    "(set LOOMCYCLE_VOLUMES_ROOT, or mark a yaml volume dynamic_root: true)"
)


def volumes_root(config: dict[str, Any] | None = None) -> Path | None:
    """Where dynamic and ephemeral volumes live: a yaml entry marked `dynamic_root: true`,
    else LOOMCYCLE_VOLUMES_ROOT; None when neither is set (there are none then)."""
    block = (runtime_config() if config is None else config).get("volumes") or {}
    for raw in block.values() if isinstance(block, dict) else []:
        if isinstance(raw, dict) and raw.get("dynamic_root") and isinstance(raw.get("path"), str):
            return Path(raw["path"])
    configured = settings.LOOMCYCLE.volumes_root
    return Path(configured) if configured else None


TENANT_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def dynamic_path(tenant_id: str, name: str) -> Path:
    """`<root>/tenants/<tenant>/<name>`; the shared tenant "" is `<root>/shared/<name>`.
    Both parts are checked, so neither can climb out of the root."""
    check_name(name)
    if tenant_id and not TENANT_RE.fullmatch(tenant_id):
        raise Invalid(f"tenant id {tenant_id!r} cannot name a volume directory", code=errors.VOLUME_NAME_INVALID)
    root = volumes_root()
    if root is None:
        raise Conflict(NO_ROOT, code=errors.VOLUMES_NOT_CONFIGURED)
    return root / "shared" / name if not tenant_id else root / "tenants" / tenant_id / name


def ephemeral_dir(root_run_id: str) -> Path | None:
    root = volumes_root()
    return None if root is None else root / "ephemeral" / root_run_id


def ephemeral_purge(run_id: str) -> bool:
    """Remove a top-level run's ephemeral volumes; False when it had none (idempotent)."""
    target = ephemeral_dir(run_id)
    if target is None or not target.is_dir():
        return False
    _remove_tree(target, f"run {run_id}: ephemeral volumes")
    return True


def _remove_tree(target: Path, what: str) -> None:
    """rmtree, once more if a writer still running (a sub-agent's tool call) added an
    entry meanwhile; what still remains after that is logged, not raised (the listener
    must not fail the run's end). Such a writer cannot re-create the tree: see root_of."""
    for attempt in (1, 2):
        try:
            shutil.rmtree(target)
        except FileNotFoundError:
            return  # gone meanwhile (a concurrent purge)
        except OSError as exc:
            if attempt == 2:
                left = sum(1 for _ in target.rglob("*")) if target.exists() else 0
                log.warning("%s: %s not fully removed (%s); %d entries remain", what, target, exc, left)
            continue
        log.info("%s purged (%s)", what, target)
        return


# --- binding resolution (registered with apps.core.toolregistry) --------------------


def _binding_spec(raw: Any, where: str) -> dict[str, Any]:
    """`name`, `name:ro|rw` or `{name, mode?, default?, ephemeral?}`."""
    if isinstance(raw, str):
        name, _, mode = raw.partition(":")
        raw = {"name": name, **({"mode": mode} if mode else {})}
    if not isinstance(raw, dict):
        raise Invalid(f"{where}: a binding is a name or a mapping", code=errors.VOLUME_BINDING_INVALID)
    unknown = sorted(set(raw) - {"name", "mode", "default", "ephemeral"})
    if unknown:
        raise Invalid(f"{where}: unknown binding field(s) {', '.join(unknown)}", code=errors.VOLUME_BINDING_INVALID)
    check_name(raw.get("name"), where)
    if raw.get("mode") is not None:
        check_mode(raw["mode"], where)
    return raw


def _bind_one(tenant_id: str, spec: dict[str, Any], statics: dict[str, StaticVolume]) -> VolumeBinding:
    from apps.tools.selectors import volume_def_find

    name, want = spec["name"], spec.get("mode")
    if spec.get("ephemeral"):
        return VolumeBinding(name=name, path="", mode=want or "rw", default=bool(spec.get("default")), ephemeral=True)
    static = statics.get(name)
    if static is not None and not static.bindable_by(tenant_id):
        static = None  # listed for other tenants only: as unknown to this one as a missing volume
    if static is not None:
        path, mode, default = static.path, static.mode, static.default
    else:
        row = volume_def_find(tenant_id=tenant_id, name=name)
        if row is None:
            raise Invalid(f"agent binds volume {name!r}, which is not configured", code=errors.VOLUME_NOT_FOUND)
        path, mode, default = row.path, row.mode, False
    if want == "rw" and mode == "ro":
        raise Invalid(f"agent binds volume {name!r} rw, but the volume is ro", code=errors.VOLUME_BINDING_INVALID)
    return VolumeBinding(name=name, path=path, mode=want or mode, default=bool(spec.get("default", default)))


def _within_parent(own: list[VolumeBinding], parent: list[VolumeBinding], parent_id: str) -> list[VolumeBinding]:
    by_name = {p.name: p for p in parent}
    out = []
    for b in own:
        p = by_name.get(b.name)
        if p is None or p.ephemeral != b.ephemeral or (not b.ephemeral and p.path != b.path):
            continue  # never wider than the parent: a volume it does not have is not inherited
        mode = "ro" if "ro" in (b.mode, p.mode) else "rw"
        root = (p.root_run_id or parent_id) if b.ephemeral else ""
        out.append(replace(b, mode=mode, root_run_id=root))
    return out


def bindings_resolve(*, tenant_id: str, definition: dict[str, Any], parent_id: str | None) -> list[dict[str, Any]]:
    """An agent definition's `volumes:` as the run's bindings (VolumeBinding.as_dict());
    raises Invalid when it binds an unknown volume, widens a mode or marks two defaults."""
    from apps.runs.selectors import run_volumes

    raw = definition.get("volumes") or []
    if not isinstance(raw, list):
        raise Invalid("agent volumes must be a list of bindings", code=errors.VOLUME_BINDING_INVALID)
    if not raw:
        return []
    statics = static_volumes()
    specs = [_binding_spec(item, f"volumes[{i}]") for i, item in enumerate(raw)]
    bound = [_bind_one(tenant_id, spec, statics) for spec in specs]
    if len({b.name for b in bound}) != len(bound):
        raise Invalid("agent binds a volume name twice", code=errors.VOLUME_BINDING_INVALID)
    if sum(b.default for b in bound) > 1:
        raise Invalid("agent marks more than one volume binding as default", code=errors.VOLUME_BINDING_INVALID)
    if parent_id is not None:
        parent = [VolumeBinding.from_dict(v) for v in run_volumes(run_id=parent_id)]
        bound = _within_parent(bound, parent, parent_id)
    return [b.as_dict() for b in bound]


# --- what a tool call uses -----------------------------------------------------------


def pick(ctx: ToolContext, name: Any) -> VolumeBinding:
    """The binding a call names, else the default binding, else the sole one."""
    if not ctx.volumes:
        raise VolumeUnavailable("file tools are not configured for this run: the agent has no volume bound")
    if name is not None:
        found = [b for b in ctx.volumes if b.name == name]
        if not found:
            bound = ", ".join(b.name for b in ctx.volumes)
            raise VolumeUnavailable(f"volume {name!r} is not bound to this run (bound: {bound})")
        return found[0]
    defaults = [b for b in ctx.volumes if b.default]
    if defaults:
        return defaults[0]
    if len(ctx.volumes) == 1:
        return ctx.volumes[0]
    bound = ", ".join(b.name for b in ctx.volumes)
    raise VolumeUnavailable(f"several volumes are bound ({bound}) and none is the default; name one with `volume`")


def root_of(ctx: ToolContext, binding: VolumeBinding) -> Path:
    """The binding's directory on this worker. An ephemeral one is made on first use;
    any other must exist already (a multi-host deployment mounts it on every worker)."""
    if binding.ephemeral:
        return _ephemeral_root(ctx, binding)
    path = Path(binding.path)
    if not path.is_dir():
        raise VolumeUnavailable(
            f"volume {binding.name!r}: directory {binding.path} does not exist on this worker "
            "(every worker needs the volume mounted at the same path)"
        )
    return path


EPHEMERAL_GONE = "the run's ephemeral volume is gone: its top-level run has ended"


def _ephemeral_root(ctx: ToolContext, binding: VolumeBinding) -> Path:
    """`ephemeral/<top-level run>/<name>`, made on first use while the top-level run is
    live. A purge runs after the run's terminal status is committed, so: checked before
    the mkdir, nothing is made for an ended run; checked again after it, a directory made
    while the run ended (the purge may have passed already) is removed and refused.
    Either way a sub-agent still running never leaves a purged tree re-created."""
    from apps.runs.selectors import run_status
    from apps.runs.statuses import TERMINAL

    root_run = binding.root_run_id or ctx.run_id
    where = ephemeral_dir(root_run)
    if where is None:
        raise VolumeUnavailable(f"volume {binding.name!r}: {NO_ROOT}")

    def ended() -> bool:
        status = run_status(run_id=root_run)
        return status is None or status in TERMINAL

    if ended():
        raise VolumeUnavailable(f"volume {binding.name!r}: {EPHEMERAL_GONE}")
    path = where / binding.name
    path.mkdir(parents=True, exist_ok=True)
    if ended():
        _remove_tree(where, f"run {root_run}: ephemeral volumes re-made by a late call")
        raise VolumeUnavailable(f"volume {binding.name!r}: {EPHEMERAL_GONE}")
    return path


def ephemeral_volumes_finished(run_id: str, status: str) -> None:
    """The registry.on_run_finished listener: a top-level run's ephemeral volumes go with it."""
    ephemeral_purge(run_id)


# --- posture (apps.tools.posture, `doctor`) ------------------------------------------


def file_stances() -> list[Any]:
    """Read/Write/Edit/Glob/Grep and Bash under the current settings and yaml `volumes:`.
    Managed sandbox: no volume of any kind and Bash off. Agentic dev: an rw static volume and Bash on."""
    from apps.tools.posture import ToolStance

    statics = static_volumes()
    listed = ", ".join(f"{v.name} ({v.mode}{', default' if v.default else ''})" for v in statics.values())
    where = f"static volumes {listed}" if statics else "no static volume"
    root = volumes_root()
    dynamic = f"dynamic and ephemeral volumes under {root}" if root else "no dynamic or ephemeral volumes"
    files = f"only volumes an agent binds: {where}; {dynamic}"
    has_rw = any(v.mode == "rw" for v in statics.values())
    sandboxed = not statics and root is None
    out = [ToolStance(t, files, sandboxed, has_rw) for t in ("Read", "Write", "Edit", "Glob", "Grep")]
    bash_on = bool(settings.LOOMCYCLE.bash_enabled)
    out.append(ToolStance("Bash", _bash_stance() if bash_on else BASH_OFF, not bash_on, bash_on))
    return out


BASH_OFF = "refuses every call: not configured (LOOMCYCLE_BASH_ENABLED is off)"


def _bash_stance() -> str:
    from apps.tools import sandbox

    conf = settings.LOOMCYCLE
    tenants = f" and tenants {', '.join(conf.bash_tenants)}" if conf.bash_tenants else ""
    who = f"agents of the operator's yaml{tenants}"
    if conf.bash_unsandboxed:
        return (
            f"runs /bin/sh in a bound rw volume as the worker's user: NOT a sandbox (LOOMCYCLE_BASH_UNSANDBOXED=1; "
            f"timeout, 1 MiB output, env scrubbed); for {who}"
        )
    missing = sandbox.unavailable()
    if missing:
        return f"refuses every call: {missing}"
    return (
        f"runs /bin/sh in a bubblewrap sandbox: only the bound volumes, read-only system, no network, "
        f"uid {conf.bash_sandbox_uid}, {conf.bash_limit_cpu_seconds} CPU s, {conf.bash_limit_memory_bytes} bytes, "
        f"{conf.bash_limit_processes} processes; for {who}"
    )
