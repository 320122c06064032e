"""The wire shapes of /v1/_retention and /v1/_erasure (docs/api.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class RetentionSetIn(BaseModel):
    agent: str = Field(default="", max_length=128, description='"" sets the tenant\'s default')
    max_age_days: int = Field(ge=0, le=36_500, description="0 keeps forever")
    tenant: str = Field(default="", max_length=128, description="admins only")


class RetentionPolicyOut(BaseModel):
    agent: str
    max_age_days: int
    source: str  # api | yaml


class RetentionOverrideOut(BaseModel):
    tenant: str
    agent: str
    until: str
    set_by: str
    created_at: str


class RetentionOut(BaseModel):
    tenant: str
    default_days: int
    policies: list[RetentionPolicyOut]
    overrides: list[RetentionOverrideOut]


class ErasureIn(BaseModel):
    subject: str = Field(min_length=1, max_length=128)
    dry_run: bool = True
    confirm: str = Field(default="", max_length=128)


class ErasureOut(BaseModel):
    tenant: str
    subject: str
    dry_run: bool = False
    erasure_id: str = ""
    status: str = ""
    deleted: dict[str, int] = Field(default_factory=dict)
    retained: dict[str, str] = Field(default_factory=dict)
    tier1_covered: dict[str, Any] | None = None
    tier2_uncovered: dict[str, Any] | None = None
    tier3_residue: dict[str, Any] | None = None
    residue: dict[str, Any] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    notes: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
