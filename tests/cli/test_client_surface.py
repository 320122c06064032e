"""The client covers the whole REST surface: every operation of /v1/openapi.json is reached by a
method of `Client` and one of `AsyncClient` (each method names the operation ids it calls with
`loomcycle_http.client._base.op`), every such name is a real operation, and the two clients have
the same resources and methods, the async ones awaited or async-iterated."""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

import pytest

from loomcycle_http.client import AsyncClient, Client
from loomcycle_http.client._base import OPS_ATTR
from loomcycle_project.api import api

# Operations no client method is meant to call, each with its reason. Empty today: keep it short.
NOT_IN_THE_CLIENT: dict[str, str] = {}


def _operation_ids() -> set[str]:
    schema = api.get_openapi_schema(path_prefix="/v1/")
    return {op["operationId"] for item in schema["paths"].values() for op in item.values()}


def _resources(client: Any) -> dict[str, Any]:
    """The client's resources: its attributes that hold a client (`_c`)."""
    return {name: value for name, value in vars(client).items() if getattr(value, "_c", None) is client}


def _methods(resource: Any) -> dict[str, Any]:
    kind = type(resource)
    return {
        name: getattr(kind, name) for name in dir(kind) if not name.startswith("_") and callable(getattr(kind, name))
    }


def _reached(client: Any) -> dict[str, set[str]]:
    """Operation id -> the `resource.method`s that call it (`{kind}` filled in from the resource's kind)."""
    found: dict[str, set[str]] = defaultdict(set)
    for attr, resource in _resources(client).items():
        for name, method in _methods(resource).items():
            for tag in getattr(method, OPS_ATTR, ()):
                found[tag.format(kind=getattr(resource, "kind", ""))].add(f"{attr}.{name}")
    return found


@pytest.fixture(scope="module")
def clients() -> Any:
    sync, aio = Client("http://127.0.0.1:9"), AsyncClient("http://127.0.0.1:9")  # never connected
    yield sync, aio
    sync.http.close()


def test_every_operation_of_the_openapi_document_has_a_sync_and_an_async_method(clients: Any) -> None:
    wanted = _operation_ids() - set(NOT_IN_THE_CLIENT)
    for client in clients:
        missing = sorted(wanted - set(_reached(client)))
        assert not missing, f"{type(client).__name__} has no method calling {missing}"


def test_every_operation_a_method_names_is_in_the_document(clients: Any) -> None:
    known = _operation_ids()
    for client in clients:
        stale = {op: where for op, where in _reached(client).items() if op not in known}
        assert not stale, f"{type(client).__name__} names operations the API does not have: {stale}"
    assert set(NOT_IN_THE_CLIENT) <= known


def test_the_async_client_has_every_resource_and_method_of_the_sync_one(clients: Any) -> None:
    sync, aio = clients
    assert set(_resources(sync)) == set(_resources(aio))
    for attr, resource in _resources(sync).items():
        twin = _resources(aio)[attr]
        assert set(_methods(resource)) == set(_methods(twin)), attr
        for name, method in _methods(twin).items():
            if inspect.isfunction(method) and getattr(method, OPS_ATTR, ()):
                returns = str(inspect.signature(method).return_annotation)
                awaited = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
                assert awaited or "AsyncIterator" in returns, f"AsyncClient.{attr}.{name} is neither awaited nor async"
