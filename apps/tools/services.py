"""Dynamic volumes (VolumeDef rows): create, delete, purge. Invariants:
- a row is one (tenant, name); its directory is `<volumes root>/tenants/<tenant>/<name>`
  (`shared/<name>` for the shared tenant), made when the row is created;
- a static (yaml) name cannot be taken by a dynamic volume: the static one would
  shadow it for every run;
- create is idempotent (same name and mode: the existing row, `deduplicated`);
- delete unmaps and keeps the files; purge unmaps and removes the directory;
- a tenant holds at most LOOMCYCLE_TENANT_MAX_VOLUMES rows (429 `tenant_quota_exceeded`,
  apps.core.quotas), counted before the directory is made and again with the insert.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from apps.core.errors import Conflict, Invalid, NotFound
from apps.core.quotas import tenant_count_check, tenant_count_lock
from apps.core.types import Principal
from apps.tools import errors
from apps.tools.models import VolumeDef
from apps.tools.schemas import VolumeDefOpIn
from apps.tools.selectors import volume_def_find, volume_defs_list
from apps.tools.volumes import check_mode, check_name, dynamic_path, static_volumes, volumes_root


def volume_def_out(row: VolumeDef, **extra: Any) -> dict[str, Any]:
    return {
        "name": row.name,
        "mode": row.mode,
        "path": row.path,
        "tenant_id": row.tenant_id,
        "created_at": row.created_at.isoformat(),
        **extra,
    }


def volume_def_create(*, tenant_id: str, name: Any, mode: Any = "rw") -> dict[str, Any]:
    name, mode = check_name(name), check_mode("rw" if mode is None else mode)
    path = dynamic_path(tenant_id, name)  # refuses first when this runtime has no volumes root
    if name in static_volumes():
        raise Conflict(f"volume {name!r} is a static (yaml) volume", code=errors.VOLUME_STATIC)
    existing = volume_def_find(tenant_id=tenant_id, name=name)
    if existing is not None:
        if existing.mode != mode:
            raise Conflict(f"volume {name!r} exists with mode {existing.mode}", code="volume_exists")
        return volume_def_out(existing, deduplicated=True)
    _check_count(tenant_id)  # refused before its directory is made (the exact check is the insert's)
    _make_dir(path)
    try:
        with transaction.atomic():
            tenant_count_lock("volumes", tenant_id)  # the count and the insert are one decision
            _check_count(tenant_id)
            row = VolumeDef.objects.create(tenant_id=tenant_id, name=name, mode=mode, path=str(path))
    except IntegrityError:  # a concurrent create of the same name won: answer as the second call would
        return volume_def_create(tenant_id=tenant_id, name=name, mode=mode)
    return volume_def_out(row, deduplicated=False)


def _check_count(tenant_id: str) -> None:
    tenant_count_check(
        resource="volumes",
        tenant_id=tenant_id,
        held=VolumeDef.objects.filter(tenant_id=tenant_id).count(),
        cap=settings.LOOMCYCLE.tenant_max_volumes,
        setting="LOOMCYCLE_TENANT_MAX_VOLUMES",
    )


def _make_dir(path: Path) -> None:
    """The volume's directory below an existing volumes root: a host where the root is
    not mounted refuses (503) instead of making a local directory nobody else sees."""
    root = volumes_root()
    if root is None or not root.is_dir():
        raise errors.VolumesUnavailable(
            f"the volumes root {root} does not exist on this host (mount it at the same path as on the workers)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.VolumesUnavailable(
            f"cannot make the volume's directory: {exc.strerror}", code=errors.VOLUME_DIR_FAILED
        ) from exc


def _found(tenant_id: str, name: Any) -> VolumeDef:
    row = volume_def_find(tenant_id=tenant_id, name=check_name(name))
    if row is None:
        raise NotFound(f"volume {name!r} not found", code=errors.VOLUME_NOT_FOUND)
    return row


def volume_def_get(*, tenant_id: str, name: Any) -> dict[str, Any]:
    return volume_def_out(_found(tenant_id, name))


def volume_def_delete(*, tenant_id: str, name: Any) -> dict[str, Any]:
    """Unmap the volume; its files stay on disk."""
    row = _found(tenant_id, name)
    VolumeDef.objects.filter(pk=row.pk).delete()
    return {"name": row.name, "deleted": True, "purged": False}


def volume_def_purge(*, tenant_id: str, name: Any) -> dict[str, Any]:
    """Unmap the volume and remove its directory."""
    row = _found(tenant_id, name)
    VolumeDef.objects.filter(pk=row.pk).delete()
    if Path(row.path).is_dir():
        shutil.rmtree(row.path)
    return {"name": row.name, "deleted": True, "purged": True}


VOLUME_OPS = ("create", "get", "list", "delete", "purge")


def volume_def_dispatch(principal: Principal, body: VolumeDefOpIn) -> dict[str, Any]:
    """One VolumeDef op in the caller's tenant (POST /v1/_volumedef, gRPC VolumeDef)."""
    tenant = principal.tenant_id
    if body.op == "create":
        return volume_def_create(tenant_id=tenant, name=body.name, mode=body.mode)
    if body.op == "get":
        return volume_def_get(tenant_id=tenant, name=body.name)
    if body.op == "list":
        return {"volumes": [volume_def_out(r) for r in volume_defs_list(tenant_id=tenant)]}
    if body.op == "delete":
        return volume_def_delete(tenant_id=tenant, name=body.name)
    if body.op == "purge":
        return volume_def_purge(tenant_id=tenant, name=body.name)
    raise Invalid(f"unknown op {body.op!r}; one of {', '.join(VOLUME_OPS)}", code=errors.VOLUME_OP_INVALID)
