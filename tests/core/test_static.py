"""The Django admin's static files are served by the web process (Daphne), with no collectstatic step."""

from __future__ import annotations

import httpx


def test_admin_static_files_are_served(http: httpx.Client) -> None:
    css = http.get("/static/admin/css/base.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert b"body" in css.content
    assert http.get("/static/admin/css/no-such-file.css").status_code == 404


def test_admin_login_page_renders(http: httpx.Client) -> None:
    page = http.get("/admin/login/")
    assert page.status_code == 200 and "/static/admin/css/base.css" in page.text
