"""The client's typed results name the fields the API documents: `Run` is the OpenAPI `RunOut`
(and `TenantRunOut`'s tenant_id), so a field renamed on one side fails here, not in a user's code."""

from __future__ import annotations

from typing import get_type_hints

import pytest
from pydantic import BaseModel

from apps.channels.schemas import ChannelMessageOut, ChannelOut, ChannelPublishedOut, ChannelReadOut
from apps.memory.schemas import MemoryEntryOut, MemoryHitOut, MemoryPutOut, MemorySearchOut
from apps.runs.pages_schemas import SessionOut
from apps.runs.schemas import RunOut, TenantRunOut
from apps.substrate.schemas import DefNameOut
from loomcycle_http.client import Run
from loomcycle_http.client.types import (
    Channel,
    ChannelMessage,
    ChannelPublished,
    ChannelRead,
    DefName,
    MemoryEntry,
    MemoryHit,
    MemoryPut,
    MemorySearch,
    Session,
)


def test_the_clients_run_has_the_fields_of_the_apis_run() -> None:
    assert set(get_type_hints(Run)) == set(TenantRunOut.model_fields)
    assert set(TenantRunOut.model_fields) - set(RunOut.model_fields) == {"tenant_id"}
    assert Run.__required_keys__ == frozenset(RunOut.model_fields)


def _fields(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    ("typed", "model"),
    [
        (Session, SessionOut),
        (DefName, DefNameOut),
        (MemoryEntry, MemoryEntryOut),
        (MemoryPut, MemoryPutOut),
        (MemoryHit, MemoryHitOut),
        (MemorySearch, MemorySearchOut),
        (Channel, ChannelOut),
        (ChannelMessage, ChannelMessageOut),
        (ChannelPublished, ChannelPublishedOut),
        (ChannelRead, ChannelReadOut),
    ],
)
def test_definitions_memory_channels_and_sessions_results_have_the_apis_fields(
    typed: type, model: type[BaseModel]
) -> None:
    """Each TypedDict names the fields of its OpenAPI component; the optional ones (a default on
    the model) are NotRequired, the rest required."""
    assert set(get_type_hints(typed)) == _fields(model), typed.__name__
    required = {name for name, field in model.model_fields.items() if field.is_required()}
    assert typed.__required_keys__ == frozenset(required), typed.__name__
