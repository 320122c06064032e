"""API paths skip the admin's browser middleware (apps.core.middleware);
the admin keeps it, and API requests still get Django's Host check."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.test import Client


@pytest.mark.django_db
def test_api_paths_skip_the_browser_middleware_and_the_admin_keeps_it(client: Client) -> None:
    api = client.get("/healthz")
    admin = client.get("/admin/login/")
    assert api.status_code == 200 and admin.status_code == 200
    # SecurityMiddleware's headers and the CSRF cookie: on the admin page, not on the API
    assert admin.headers.get("Cross-Origin-Opener-Policy") == "same-origin"
    assert admin.headers.get("X-Content-Type-Options") == "nosniff"
    assert "csrftoken" in admin.cookies
    assert "Cross-Origin-Opener-Policy" not in api.headers
    assert "X-Content-Type-Options" not in api.headers
    assert not api.cookies


@pytest.mark.django_db
def test_api_requests_still_get_the_allowed_hosts_check(client: Client, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token="env-secret")  # not open mode
    settings.ALLOWED_HOSTS = ["api.example"]
    assert client.get("/healthz", headers={"host": "api.example"}).status_code == 200
    refused = client.get("/healthz", headers={"host": "other.example"})
    assert refused.status_code == 400 and b"open_mode_host" not in refused.content  # Django's DisallowedHost
