"""Browser fixtures for the console (apps/console): headless Debian Chromium driven by
Playwright against the session's real web process (`web`) and workers (`stack`).

`console` signs pages in with a bearer and keeps screenshots under
LOOMCYCLE_DATA_DIR/artifacts/console/<test name>/screenshots (`console.shot(page, "name")`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize

from tests.factories.browser import launched

PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1280, "height": 800}


def bearer(headers: dict[str, str]) -> str:
    """The raw token of one of the `people` fixture's header dicts."""
    return headers["authorization"].removeprefix("Bearer ")


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    with launched(monkeypatch) as chromium:
        yield chromium


@dataclass
class Console:
    """The console of the test's web process, seen through one browser."""

    base: str
    browser: Browser
    screenshots: Path
    contexts: list[BrowserContext] = field(default_factory=list)

    def new_page(self, *, phone: bool = False) -> Page:
        """A page in a fresh context (its own cookie jar: one session per page)."""
        context = self.browser.new_context(viewport=PHONE if phone else DESKTOP)
        self.contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        return page

    def sign_in(self, token: str, *, phone: bool = False) -> Page:
        """A fresh page signed in with `token` ("" = open mode), on the page sign-in lands on."""
        page = self.new_page(phone=phone)
        page.goto(f"{self.base}/ui/signin")
        page.fill("#id_token", token)
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("#whoami")
        return page

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def shot(self, page: Page, name: str) -> Path:
        """A full-page screenshot kept under this test's screenshots folder."""
        path = self.screenshots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path


@pytest.fixture
def console(web: str, browser: Browser, request: pytest.FixtureRequest) -> Iterator[Console]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:120]
    folder = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "artifacts" / "console" / name / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    kit = Console(base=web, browser=browser, screenshots=folder)
    try:
        yield kit
    finally:
        for context in kit.contexts:
            context.close()


CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF_FIELD.search(html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def http_sign_in(client: httpx.Client, token: str) -> None:
    """Sign `client` (its own cookie jar) in with `token` as the sign-in form does."""
    page = client.get("/ui/signin")
    answer = client.post("/ui/signin", data={"csrfmiddlewaretoken": csrf_of(page.text), "token": token, "next": ""})
    assert answer.status_code == 302, answer.text[:500]
