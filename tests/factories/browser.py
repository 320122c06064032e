"""Headless Chromium for the browser tests (Debian's package, driven by Playwright; Playwright's own
browser download is unreachable here)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.factories.observability import CHROMIUM, CHROMIUM_ARGS


@contextmanager
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    # Playwright's sync API runs an event loop on this thread, and Django then refuses ORM calls
    # here; these tests make them between browser steps, never concurrently (Playwright's advice).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
