"""Dynamic volumes (SPEC 5.2 VolumeDef): a tenant's named directory under the
operator's `LOOMCYCLE_VOLUMES_ROOT`. Not versioned: one row per (tenant, name).
Static volumes live in yaml (`volumes:`) and per-run ephemeral volumes have no
row at all (apps.tools.volumes)."""

from __future__ import annotations

from django.db import models


class VolumeMode(models.TextChoices):
    RO = "ro"
    RW = "rw"


class VolumeDef(models.Model):
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    name = models.CharField(max_length=64)
    mode = models.CharField(max_length=2, choices=VolumeMode.choices, default=VolumeMode.RW)
    path = models.CharField(max_length=1024)  # derived at create, kept if the root setting moves later
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "name"], name="volumedef_tenant_name")]

    def __str__(self) -> str:
        return f"{self.tenant_id or '(shared)'}/{self.name} {self.mode}"
