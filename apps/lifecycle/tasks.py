"""Thin Celery adapters over the lifecycle services (beat: `retention-sweep`, `erasure-resume`).

Invariant: both are bounded passes, idempotent and safe to overlap or kill (each tree and
each erasure batch is its own transaction; apps.lifecycle.retention and erasure say how)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.lifecycle import erasure, retention
from workers.base import AgentTask


@shared_task(base=AgentTask, name="maintenance.retention_sweep")
def retention_sweep_task(**_: Any) -> int:
    """Delete the run trees past their retention age; the trees deleted."""
    return retention.retention_sweep().trees


@shared_task(base=AgentTask, name="maintenance.erasure_resume")
def erasure_resume_task(**_: Any) -> int:
    """Continue erasures left running (a crash, live runs that since ended)."""
    return erasure.erasures_resume()
