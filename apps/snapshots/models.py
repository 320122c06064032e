"""A stored snapshot (SPEC 10 `snapshots`): its metadata and the envelope
text exactly as captured, so the export is byte-identical to what the
checksum was computed over. Rows are written once and deleted whole."""

from __future__ import annotations

from django.db import models


class Snapshot(models.Model):
    id = models.CharField(primary_key=True, max_length=48)  # snap_<unix_ms>_<8hex>
    created_at = models.DateTimeField()
    label = models.CharField(max_length=256, blank=True, default="")
    schema_version = models.CharField(max_length=16)
    byte_size = models.BigIntegerField()
    checksum = models.CharField(max_length=80)  # sha256:<hex> of the canonical sections
    content = models.TextField()  # the envelope JSON

    class Meta:
        ordering = ["-created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} {self.label}".strip()
