"""The client's typed results name the fields the API documents: `Run` is the OpenAPI `RunOut`
(and `TenantRunOut`'s tenant_id), so a field renamed on one side fails here, not in a user's code."""

from __future__ import annotations

from typing import get_type_hints

from apps.runs.schemas import RunOut, TenantRunOut
from loomcycle_http.client import Run


def test_the_clients_run_has_the_fields_of_the_apis_run() -> None:
    assert set(get_type_hints(Run)) == set(TenantRunOut.model_fields)
    assert set(TenantRunOut.model_fields) - set(RunOut.model_fields) == {"tenant_id"}
    assert Run.__required_keys__ == frozenset(RunOut.model_fields)
