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
