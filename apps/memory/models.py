"""Durable agent memory (SPEC 6.2, 9.5): one JSON value per
(tenant, scope, scope_id, key), an optional expiry and an optional embedding
for vector search. Writes go through apps.memory.services, reads through
apps.memory.selectors; the `Memory` tool and `/v1/_memory` REST sit on top."""

from __future__ import annotations

from django.db import models
from pgvector.django import HnswIndex, VectorField

EMBEDDING_DIMENSIONS = 384


class MemoryScope(models.TextChoices):
    AGENT = "agent", "agent"  # scope_id = agent name
    USER = "user", "user"  # scope_id = the run's user_id
    TENANT = "tenant", "tenant"  # scope_id = ""
    GLOBAL = "global", "global"  # scope_id = ""


class MemoryEntry(models.Model):
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    scope = models.CharField(max_length=16, choices=MemoryScope.choices)
    scope_id = models.CharField(max_length=256, default="", blank=True)
    key = models.CharField(max_length=512)
    value = models.JSONField()
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)  # None: never; expired rows are invisible
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    # Which embedder made `embedding` ("" when none): search compares only vectors of the configured one.
    embedding_provider = models.CharField(max_length=128, default="", blank=True)
    embedding_model = models.CharField(max_length=256, default="", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "scope", "scope_id", "key"], name="memoryentry_tenant_scope_key"
            ),
        ]
        indexes = [
            HnswIndex(
                name="memoryentry_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
        ]
        ordering = ["tenant_id", "scope", "scope_id", "key"]
        verbose_name = "memory entry"
        verbose_name_plural = "memory entries"

    def __str__(self) -> str:
        return f"{self.scope}:{self.scope_id}/{self.key}"
