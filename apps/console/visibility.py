"""Who sees a console2 section in the nav: whoever the scope rule of its REST twin lets in
(apps.substrate.auth.authorize, the table the API applies), so the nav never offers a 403."""

from __future__ import annotations

from collections.abc import Callable

from apps.core.errors import Forbidden
from apps.core.types import Principal
from apps.substrate.auth import authorize


def rest_allows(rest: str) -> Callable[[Principal], bool]:
    """A `visible` test for NavEntry: `rest` is "METHOD /v1/path" of the page's REST twin."""
    method, _, path = rest.partition(" ")

    def visible(principal: Principal) -> bool:
        try:
            authorize(principal, method, path)
        except Forbidden:
            return False
        return True

    return visible
