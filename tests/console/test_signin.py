"""Console sign-in (apps/console/session.py) against the real web process: a pasted
bearer becomes a session cookie (HttpOnly, SameSite=Lax, no token in the browser), a
retired token's session stops within a second, sign-out flushes, CSRF guards every
form, and open mode on loopback signs in as the open principal."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.sessions.models import Session

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run
from apps.runs.prompt import Segment
from apps.substrate import tokens
from tests.conftest import daphne, wait_for
from tests.console.conftest import Console, bearer, csrf_of, http_sign_in

pytestmark = pytest.mark.usefixtures("web", "agents")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


def scripted(steps: list[dict[str, Any]], principal: Principal = ACME, **kw: Any) -> Run:
    prompt = f"Console test. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=principal, data=data)


def test_a_tenant_token_signs_in_and_lists_its_tenants_runs(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    run = scripted([{"text": "hello"}])
    page = console.sign_in(bearer(people["alice"]))
    assert page.url.endswith("/ui/runs/")
    assert page.inner_text("#whoami") == "alice @ acme"
    page.wait_for_selector(f"tr[data-run='{run.id}']")
    console.shot(page, "runs-desktop")
    phone = console.sign_in(bearer(people["alice"]), phone=True)
    phone.wait_for_selector(f"tr[data-run='{run.id}']")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scroll but the table's
    console.shot(phone, "runs-phone")
    beta = console.sign_in(bearer(people["charlie"]))
    assert beta.locator(f"tr[data-run='{run.id}']").count() == 0
    assert beta.locator("#no-runs").count() == 1


def test_the_session_cookie_is_httponly_lax_and_the_token_stays_off_the_browser(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    token = bearer(people["alice"])
    page = console.sign_in(token)
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["sessionid"]
    assert session["httpOnly"] is True and session["sameSite"] == "Lax"
    assert all(token not in c["value"] for c in cookies.values())
    stored = page.evaluate("JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])")
    assert token not in stored
    assert token not in page.content()
    data = Session.objects.get(session_key=session["value"]).get_decoded()
    assert token not in json.dumps(data)
    assert data["lc_console_ref"] == "token:" + tokens.token_hash(token)


def test_a_wrong_token_is_refused_with_no_session(console: Console, people: dict[str, dict[str, str]]) -> None:
    page = console.new_page()
    page.goto(console.url("/ui/signin"))
    page.fill("#id_token", "lct_notatoken")
    page.click("#signin-form button[type=submit]")
    assert page.inner_text("#signin-error") == "That token was not accepted."
    console.shot(page, "signin-refused")
    page.goto(console.url("/ui/runs/"))
    assert "/ui/signin?next=" in page.url


def test_sign_out_flushes_the_session(console: Console, people: dict[str, dict[str, str]]) -> None:
    page = console.sign_in(bearer(people["alice"]))
    old = next(c for c in page.context.cookies() if c["name"] == "sessionid")["value"]
    page.click("#signout")
    page.wait_for_selector("#signin-form")
    assert not Session.objects.filter(session_key=old).exists()
    with httpx.Client(base_url=console.base, cookies={"sessionid": old}) as client:
        assert client.get("/ui/runs/").status_code == 302


def test_a_retired_tokens_session_stops_within_a_second(
    stack_env: dict[str, str], logdir: Path, people: dict[str, dict[str, str]]
) -> None:
    """Every request made more than a second after the retire commits is refused. The web
    process runs with the default LOOMCYCLE_AUTH_EPOCH_CHECK_MS (1000: how often it re-reads
    the token cache's epoch; the test suite's own web process checks on every request)."""
    with daphne(stack_env, logdir, name="daphne-epoch", LOOMCYCLE_AUTH_EPOCH_CHECK_MS="1000") as base:
        with httpx.Client(base_url=base, timeout=10) as client:
            http_sign_in(client, bearer(people["alice"]))
            for _ in range(3):  # the token's lookup is cached now: the epoch alone ends it
                assert client.get("/ui/runs/").status_code == 200
            tokens.token_retire(name="alice")
            retired = time.monotonic()
            answers: list[tuple[float, int]] = []

            def refused() -> bool:
                started = time.monotonic() - retired
                answers.append((started, client.get("/ui/runs/").status_code))
                return answers[-1][1] == 302

            wait_for(refused, timeout=5)
    print(f"first refusal: request started {answers[-1][0]:.3f} s after the retire ({len(answers)} requests)")
    assert all(status == 200 for _, status in answers[:-1])
    assert all(started <= 1.0 for started, status in answers if status == 200)


def test_a_post_without_the_csrf_token_is_refused(web: str, people: dict[str, dict[str, str]]) -> None:
    with httpx.Client(base_url=web, timeout=10) as client:
        page = client.get("/ui/signin")
        token = bearer(people["alice"])
        assert client.post("/ui/signin", data={"token": token}).status_code == 403
        http_sign_in(client, token)
        assert client.post("/ui/signout").status_code == 403
        assert client.get("/ui/runs/").status_code == 200  # still signed in
        fresh = csrf_of(client.get("/ui/runs/").text)
        assert client.post("/ui/signout", data={"csrfmiddlewaretoken": fresh}).status_code == 302
        assert page.status_code == 200


def test_open_mode_on_loopback_signs_in_as_the_open_principal(console: Console) -> None:
    page = console.new_page()
    page.goto(console.url("/ui/signin"))
    page.wait_for_selector("#open-mode-note")
    page.click("#signin-form button[type=submit]")
    assert page.inner_text("#whoami") == "open mode"
    console.shot(page, "open-mode")


UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
    .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.name)"""


# console2's pages (with their forms), checked for labels with console's.
CONSOLE2_PAGES = (
    "/ui/library/agent/",
    "/ui/library/agent/scripted/",
    "/ui/spend/",
    "/ui/channels/",
    "/ui/channels/notes/",
    "/ui/memory/",
    "/ui/schedules/",
    "/ui/webhooks/",
)


def test_every_page_is_labelled_and_reached_by_keyboard(console: Console, people: dict[str, dict[str, str]]) -> None:
    page = console.sign_in(bearer(people["alice"]))
    for path in ("/ui/runs/", "/ui/playground/", "/ui/inbox/", *CONSOLE2_PAGES):
        answer = page.goto(console.url(path))
        assert answer is not None and answer.ok, path  # a page with its forms, not an error page
        assert page.evaluate(UNLABELLED) == [], path
    page.goto(console.url("/ui/runs/"))
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.goto(console.url("/ui/runs/"))
    reached: list[str] = []
    while "Sign out" not in reached and len(reached) < 20:  # the nav's entries, then the sign-out button
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.textContent.trim()"))
        assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    assert {"Playground", "Runs", "Inbox", "Library", "Spend", "Sign out"} <= set(reached)
    for _ in range(10):  # back onto the Inbox link; Enter follows it
        page.keyboard.press("Shift+Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == "Inbox":
            break
    page.keyboard.press("Enter")
    page.wait_for_selector("h1:has-text('Inbox')")


def test_the_session_cookie_is_secure_on_an_https_request(
    stack_env: dict[str, str], logdir: Path, people: dict[str, dict[str, str]]
) -> None:
    """Behind a TLS-terminating proxy (LOOMCYCLE_SECURE_PROXY_SSL_HEADER) the sign-in's session
    cookie is Secure, HttpOnly and SameSite=Lax; over plain loopback HTTP it is not Secure."""
    proxy = {"LOOMCYCLE_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}
    with daphne(stack_env, logdir, name="daphne-tls", **proxy) as base:
        for proto, secure in (("https", True), ("http", False)):
            with httpx.Client(base_url=base, timeout=10, headers={"X-Forwarded-Proto": proto}) as client:
                page = client.get("/ui/signin")
                form = {"csrfmiddlewaretoken": csrf_of(page.text), "token": bearer(people["alice"]), "next": ""}
                # A Secure cookie is not sent back over the test's plain-HTTP hop: send it by hand.
                headers = {
                    "Referer": f"{proto}://{client.base_url.netloc.decode()}/ui/signin",
                    "Cookie": f"csrftoken={page.cookies['csrftoken']}",
                }
                client.cookies.clear()
                answer = client.post("/ui/signin", data=form, headers=headers)
                assert answer.status_code == 302, answer.text[:300]
                cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and "sessionid=" in v)
                flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
                assert "httponly" in flags and "samesite=lax" in cookie.lower().replace(" ", ""), cookie
                assert ("secure" in flags) is secure, (proto, cookie)
