"""Request bodies of the tools app's admin routes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class VolumeDefOpIn(BaseModel):
    """`POST /v1/_volumedef`: op create | get | list | delete | purge."""

    model_config = ConfigDict(extra="forbid")

    op: str
    name: Any = None
    mode: Any = None


class VolumeDefOpOut(BaseModel):
    """The op's answer: a volume (create, get), `{"volumes": [...]}` (list), or what delete and purge
    removed (apps.tools.services.volume_def_dispatch); its fields depend on the op."""

    model_config = ConfigDict(extra="allow")
