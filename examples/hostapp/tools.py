"""The app's agent tool: the calling user's notes, never anyone else's."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from examples.hostapp.models import Note
from loomcycle_project.extend import RunContext, tool


@tool
def my_notes(
    run: RunContext,
    contains: Annotated[str, Field(description="only notes whose text contains this (case-insensitive)")] = "",
    limit: Annotated[int, Field(ge=1, le=50, description="at most this many notes")] = 10,
) -> list[str]:
    """List the notes of the user this run acts for, newest first."""
    notes = Note.objects.filter(tenant_id=run.tenant_id, owner=run.user_id)
    if contains:
        notes = notes.filter(text__icontains=contains)
    return list(notes.order_by("-id").values_list("text", flat=True)[:limit])
