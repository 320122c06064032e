"""loomcycle_http.client: a small typed client of a loomcycle runtime's HTTP API (docs/client.md).

    from loomcycle_http.client import Client

    with Client("http://127.0.0.1:8787", token="lct_...") as lc:
        for event in lc.runs.start("echo", "hi"):
            print(event.type, event.data)

`AsyncClient` is the same API, awaited. Errors are `LoomcycleError`s: `ApiError`
subclasses carry the API's `code`; `ConnectionFailed` means the runtime was unreachable.
"""

from loomcycle_http.client._base import Retries
from loomcycle_http.client.aio import AsyncClient
from loomcycle_http.client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    FollowTimeout,
    Forbidden,
    LoomcycleError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
)
from loomcycle_http.client.events import TERMINAL_EVENTS, TERMINAL_STATES, Event, RunRef
from loomcycle_http.client.sync import Client
from loomcycle_http.client.types import Run

__all__ = [
    "TERMINAL_EVENTS",
    "TERMINAL_STATES",
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Event",
    "FollowTimeout",
    "Forbidden",
    "LoomcycleError",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "Retries",
    "Run",
    "RunRef",
    "ServerError",
    "Unauthorized",
]
