"""The console's navigation: one entry per page that exists. A new section adds its
entry here (docs/console.md, "Adding a page"); `visible` hides it from principals whose
scopes the page's REST twin would refuse, so the nav never offers a 403."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.urls import reverse

from apps.console.visibility import rest_allows
from apps.core.scopes import RUNS_CREATE, RUNS_READ, has_scope
from apps.core.types import Principal


def _always(principal: Principal) -> bool:
    return True


@dataclass(frozen=True)
class NavEntry:
    label: str
    url_name: str  # a name in apps.console.urls (namespace `console`)
    visible: Callable[[Principal], bool] = _always


NAV: list[NavEntry] = [
    NavEntry("Playground", "console:playground", lambda p: has_scope(p.scopes, RUNS_CREATE)),
    NavEntry("Runs", "console:runs", lambda p: has_scope(p.scopes, RUNS_READ)),
    NavEntry("Inbox", "console:inbox", lambda p: has_scope(p.scopes, RUNS_READ)),
    # console2's sections below this line.
    NavEntry("Library", "console:library", rest_allows("GET /v1/_agentdef/names")),
    NavEntry("Spend", "console:spend", rest_allows("GET /v1/_usage")),
    NavEntry("Channels", "console:channels", rest_allows("GET /v1/_channels")),
    NavEntry("Memory", "console:memory", rest_allows("GET /v1/_memory/scopes")),
    NavEntry("Schedules", "console:schedules", rest_allows("GET /v1/_schedules/list-all")),
    NavEntry("Operator", "console:ops-runtime", rest_allows("GET /v1/_state")),
]


@dataclass(frozen=True)
class NavLink:
    label: str
    href: str
    current: bool


def nav_for(principal: Principal, path: str) -> list[NavLink]:
    """The entries this principal may use; `current` marks the section `path` is in."""
    links = []
    for entry in NAV:
        if entry.visible(principal):
            href = reverse(entry.url_name)
            links.append(NavLink(entry.label, href, path.startswith(href)))
    return links
