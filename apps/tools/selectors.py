"""Reads of the tools app's tables. The tenant is always explicit."""

from __future__ import annotations

from apps.tools.models import VolumeDef


def volume_def_find(*, tenant_id: str, name: str) -> VolumeDef | None:
    return VolumeDef.objects.filter(tenant_id=tenant_id, name=name).first()


def volume_defs_list(*, tenant_id: str) -> list[VolumeDef]:
    return list(VolumeDef.objects.filter(tenant_id=tenant_id).order_by("name"))
