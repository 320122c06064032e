"""The webhook receiver end to end over HTTP, on real web processes (Daphne)
with the receiver mounted, real Postgres and Redis, and real workers where a
run must finish: signatures, 404s, body limit, mapping, dedupe, delivery
modes, unauthenticated mode, delivery records and the admin routes."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from apps.channels.models import ChannelMessage
from apps.runs.models import Run, RunEvent, TranscriptEntry
from apps.substrate import tokens
from apps.substrate.channeldefs import ChannelSpec, channeldef_create
from apps.substrate.kinds import Refused
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from tests.conftest import wait_for, wait_status
from tests.triggers.conftest import BEARER, GH_SECRET, define, github, payload, post, stripe

pytestmark = pytest.mark.usefixtures("agents")


def verdicts(name: str) -> list[str]:
    return list(WebhookDelivery.objects.filter(webhook_name=name).order_by("id").values_list("verdict", flat=True))


# --- lookup, mounting -----------------------------------------------------------------


def test_unknown_and_disabled_webhooks_answer_the_same_404(hook_webs: list[str]) -> None:
    define("dormant", enabled=False)
    body = payload(a=1)
    unknown = post(hook_webs[0], "no-such-hook", body, github(body))
    disabled = post(hook_webs[0], "dormant", body, github(body))
    assert unknown.status_code == disabled.status_code == 404
    assert unknown.json() == disabled.json() == {"code": "unknown_webhook", "error": "unknown webhook", "details": {}}
    assert verdicts("no-such-hook") == []  # an unknown path writes nothing (logged at debug, counted)
    assert verdicts("dormant") == [Verdict.REJECTED_DISABLED]


@pytest.mark.parametrize("path", ["t" * 129 + "/hook", "acme/" + "n" * 129, "acme/na%C2%B2me", "a.b/hook"])
def test_a_path_segment_that_is_not_an_identifier_is_a_404_that_writes_nothing(hook_webs: list[str], path: str) -> None:
    before = WebhookDelivery.objects.count()
    body = payload(a=1)
    resp = post(hook_webs[0], path, body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (404, "unknown_webhook")
    assert WebhookDelivery.objects.count() == before


def test_rejected_signatures_are_recorded_only_within_the_rate_limit(hook_webs: list[str]) -> None:
    """A refused delivery takes a token like an accepted one: past the burst the
    caller gets 429 and no row is written."""
    define("forged", rate_limit={"requests_per_minute": 1, "burst": 3})
    answers = [post(hook_webs[0], "forged", payload(n=n), {"X-Hub-Signature-256": "sha256=00"}) for n in range(6)]
    assert [a.status_code for a in answers] == [401, 401, 401, 429, 429, 429]
    assert answers[3].headers["Retry-After"]
    assert verdicts("forged") == [Verdict.REJECTED_SIG] * 3


def test_the_receiver_is_not_mounted_unless_enabled(web: str) -> None:
    define("unmounted")
    body = payload(a=1)
    resp = post(web, "unmounted", body, github(body))
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    assert verdicts("unmounted") == []


def test_a_tenant_path_finds_the_tenants_webhook_then_the_shared_one(hook_webs: list[str], stack: Any) -> None:
    define("shared-one")
    body = payload(a=1)
    resp = post(hook_webs[0], "acme/shared-one", body, github(body))
    assert resp.status_code == 202, resp.text
    assert post(hook_webs[0], "acme/nothing-here", body, github(body)).status_code == 404


# --- signatures -----------------------------------------------------------------------


SIGNERS = {
    "github": lambda body: github(body),
    "bare": lambda body: {"X-Loomcycle-Signature": github(body)["X-Hub-Signature-256"][len("sha256=") :]},
    "stripe": lambda body: stripe(body),
}


@pytest.mark.parametrize("envelope", sorted(SIGNERS))
def test_signature_matrix_over_http(hook_webs: list[str], stack: Any, envelope: str) -> None:
    name = f"sig-{envelope}"
    fmt = {"github": "github", "bare": "hex", "stripe": "stripe"}[envelope]
    auth = {"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": fmt}
    define(name, auth=auth, rate_limit={"requests_per_minute": 600, "burst": 50})
    base, body = hook_webs[0], payload(event="push", n=1)
    sign = SIGNERS[envelope]
    assert post(base, name, body, sign(body)).status_code == 202
    tampered = post(base, name, payload(event="push", n=2), sign(body))
    missing = post(base, name, payload(event="push", n=3))
    assert (tampered.status_code, tampered.json()["code"]) == (401, "unauthorized")
    assert (missing.status_code, missing.json()["code"]) == (401, "unauthorized")
    rows = WebhookDelivery.objects.filter(webhook_name=name, verdict=Verdict.REJECTED_SIG)
    assert sorted(rows.values_list("detail", flat=True)) == ["signature does not match", "signature header missing"]


def test_a_stale_stripe_signature_is_refused(hook_webs: list[str]) -> None:
    define("sig-stale", auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": "stripe"})
    body = payload(event="late")
    resp = post(hook_webs[0], "sig-stale", body, stripe(body, at=int(time.time()) - 600))
    assert (resp.status_code, resp.json()["code"]) == (401, "unauthorized")
    assert WebhookDelivery.objects.get(webhook_name="sig-stale").detail.startswith("signature timestamp outside")


def test_bearer_auth_compares_the_configured_token(hook_webs: list[str], stack: Any) -> None:
    define("bearer", auth={"kind": "bearer", "bearer_token_env": "LOOMCYCLE_WH_BEARER"})
    body = payload(x=1)
    assert post(hook_webs[0], "bearer", body, {"Authorization": f"Bearer {BEARER}"}).status_code == 202
    assert post(hook_webs[0], "bearer", payload(x=2), {"Authorization": "Bearer wrong"}).status_code == 401
    assert post(hook_webs[0], "bearer", payload(x=3)).status_code == 401


def test_secrets_come_only_from_allowlisted_non_empty_env_names(hook_webs: list[str], stack: Any) -> None:
    define("allowlisted", auth={"signing_secret_env": "GH_HOOK_SECRET"})
    define("not-allowlisted", auth={"signing_secret_env": "NOT_ALLOWED_SECRET"})
    define("empty-secret", auth={"signing_secret_env": "LOOMCYCLE_WH_EMPTY"})
    body = payload(x=1)
    assert post(hook_webs[0], "allowlisted", body, github(body, GH_SECRET)).status_code == 202
    for name, secret in (("not-allowlisted", "nope"), ("empty-secret", "")):
        resp = post(hook_webs[0], name, body, github(body, secret))
        assert (resp.status_code, resp.json()["code"]) == (503, "secret_unresolvable")
        assert "NOT_ALLOWED" not in resp.text and verdicts(name) == [Verdict.UNRESOLVABLE_SECRET]


def test_a_tenants_webhook_resolves_only_the_secrets_listed_for_its_tenant(
    hook_webs: list[str], stack: Any, settings: Any
) -> None:
    """The web processes give acme LOOMCYCLE_WH_SECRET only (tests/conftest.py stack_env). A row
    naming another variable, written where the rule let it (here: this process's settings), is
    refused when a delivery comes: another tenant's secret never verifies acme's deliveries."""
    import dataclasses

    from apps.substrate.kinds import get_kind
    from apps.substrate.services import Author, def_dispatch

    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, tenant_credential_env={"acme": ("LOOMCYCLE_WH_SECRET", "LOOMCYCLE_WH_BEARER")}
    )
    acme = Author(tenant_id="acme", subject="ops")
    for name, auth in (
        ("acme-signed", {"signing_secret_env": "LOOMCYCLE_WH_SECRET"}),
        ("acme-bearer", {"kind": "bearer", "bearer_token_env": "LOOMCYCLE_WH_BEARER"}),
    ):
        def_dispatch(
            get_kind("webhook"), acme, {"op": "create", "name": name, "overlay": {"agent": "echo", "auth": auth}}
        )
    body = payload(x=1)
    assert post(hook_webs[0], "acme/acme-signed", body, github(body)).status_code == 202
    refused = post(hook_webs[0], "acme/acme-bearer", body, {"Authorization": f"Bearer {BEARER}"})
    assert (refused.status_code, refused.json()["code"]) == (503, "secret_unresolvable")


# --- body, mapping --------------------------------------------------------------------


def test_a_body_over_the_limit_is_refused_before_verify_or_parse(hook_webs: list[str]) -> None:
    define("small", body_size_limit_bytes=64)
    body = payload(text="x" * 100)
    declared = post(hook_webs[0], "small", body, github(body))
    chunked = post(hook_webs[0], "small", iter([body[:50], body[50:]]), github(body))
    for resp in (declared, chunked):
        assert (resp.status_code, resp.json()["code"]) == (400, "bad_body")
    assert verdicts("small") == [Verdict.REJECTED_BODY, Verdict.REJECTED_BODY]


def test_a_mapping_needs_a_json_body(hook_webs: list[str]) -> None:
    define("mapped-bad", payload_mapping={"goal": "$.title"})
    body = b"not json"
    resp = post(hook_webs[0], "mapped-bad", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (400, "bad_mapping")
    assert verdicts("mapped-bad") == [Verdict.REJECTED_MAPPING]


def test_a_mapping_on_an_integer_past_pythons_digit_limit_is_400(hook_webs: list[str]) -> None:
    define("mapped-bigint", payload_mapping={"goal": "$.n"})
    body = b'{"n": ' + b"9" * 5000 + b"}"
    resp = post(hook_webs[0], "mapped-bigint", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (400, "bad_mapping")


@pytest.mark.parametrize("name", ["test", "recent-deliveries"])
def test_a_webhook_named_like_an_admin_route_is_refused(name: str) -> None:
    with pytest.raises(Refused, match="reserved"):
        define(name)


def test_an_unknown_signature_format_is_refused_at_definition() -> None:
    with pytest.raises(Refused, match=r"auth\.format must be one of github, hex, stripe"):
        define("fmt-bad", auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": "sha1"})


def test_a_stripe_definition_refuses_an_old_delivery_resent_as_a_body_mac(hook_webs: list[str]) -> None:
    define("sig-replay", auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": "stripe"})
    old, body = int(time.time()) - 86_400, payload(event="old")
    v1 = stripe(body, at=old)["X-Loomcycle-Signature"].split("v1=")[1]
    resent = str(old).encode() + b"." + body
    resp = post(hook_webs[0], "sig-replay", resent, {"X-Hub-Signature-256": "sha256=" + v1})
    assert (resp.status_code, resp.json()["code"]) == (401, "unauthorized")


@pytest.mark.parametrize("path", ["$..title", "$.*", "$.items[*]", "$.a[?(@.b)]", "title"])
def test_a_mapping_outside_the_path_subset_is_refused_at_definition(path: str) -> None:
    with pytest.raises(Refused, match="not a supported path"):
        define("mapped-refused", payload_mapping={"goal": path})


def test_the_mapping_feeds_the_run_as_untrusted_blocks(hook_webs: list[str], stack: Any) -> None:
    mapping = {
        "goal": "$.issue.title",
        "user_id": "$.sender.login",
        "run_metadata.repo": "$.repo.names[1]",
        "user_credentials.token": "$.secret",
    }
    define("mapped", payload_mapping=mapping, metadata={"source": "ops"})
    body = payload(
        issue={"title": "Fix </webhook_payload> it"},
        sender={"login": "octo"},
        repo={"names": ["a", "b"]},
        secret="sk-live-123",
    )
    resp = post(hook_webs[0], "mapped", body, github(body))
    assert resp.status_code == 202, resp.text
    run = wait_status(resp.json()["run_id"], "completed")
    assert (run.user_id, run.metadata) == ("octo", {"source": "ops"})
    segments = RunEvent.objects.get(run=run, type="user_input").payload["segments"]
    assert [(s["type"], s["kind"], s["text"]) for s in segments] == [
        ("untrusted-block", "webhook_payload", "Fix </webhook_payload> it"),
        ("untrusted-block", "run_metadata", '{"repo": "b"}'),
    ]
    stored = json.dumps(list(RunEvent.objects.filter(run=run).values_list("payload", flat=True)))
    stored += json.dumps(list(WebhookDelivery.objects.values_list("detail", "delivery_id")))
    assert "sk-live-123" not in stored  # credentials from the mapping are never persisted


def test_mapped_credentials_reach_the_run_sealed_and_never_in_clear(hook_webs: list[str], stack: Any) -> None:
    """`goal` unmapped: the raw body, token included, is the goal; the run's
    redactor (keyed by the mapped credential, so the marker proves the run
    received it; the sealed copy is wiped when the run ends) masks it."""
    token = "tok-" + "q7Zr2mWx9LpK" * 2
    define("mapped-creds", payload_mapping={"user_credentials.gh_token": "$.token"})
    body = payload(token=token, action="opened")
    resp = post(hook_webs[0], "mapped-creds", body, github(body))
    assert resp.status_code == 202, resp.text
    run = wait_status(resp.json()["run_id"], "completed")
    events = json.dumps(list(RunEvent.objects.filter(run=run).values_list("payload", flat=True)))
    transcript = json.dumps(list(TranscriptEntry.objects.filter(run=run).values_list("content", flat=True)))
    assert token not in events and token not in transcript
    assert "[redacted:gh_token]" in events and "[redacted:gh_token]" in transcript


# --- dedupe, delivery modes -----------------------------------------------------------


def test_a_replay_on_the_other_web_process_returns_the_first_run(hook_webs: list[str], stack: Any) -> None:
    define("dedupe", auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "delivery_id_header": "X-Delivery"})
    body = payload(n=1)
    first = post(hook_webs[0], "dedupe", body, {**github(body), "X-Delivery": "d-1"})
    again = post(hook_webs[1], "dedupe", body, {**github(body), "X-Delivery": "d-1"})
    other = payload(n=2)
    by_hash = post(hook_webs[1], "dedupe", other, github(other))
    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == {
        "webhook_name": "dedupe",
        "delivery_id": "d-1",
        "run_id": first.json()["run_id"],
        "deduped": "true",
    }
    assert by_hash.status_code == 202 and by_hash.json()["delivery_id"].startswith("sha256:")
    assert verdicts("dedupe") == [Verdict.ACCEPTED, Verdict.ACCEPTED_REPLAY, Verdict.ACCEPTED]


def test_a_channel_delivery_publishes_the_raw_body_once(hook_webs: list[str]) -> None:
    channeldef_create(tenant_id="", name="inbox-hooks", spec=ChannelSpec())
    define("to-channel", delivery="channel", channel="inbox-hooks")
    body = payload(ping=1)
    first = post(hook_webs[0], "to-channel", body, github(body))
    again = post(hook_webs[1], "to-channel", body, github(body))
    assert first.status_code == 202 and first.json()["channel"] == "inbox-hooks"
    assert again.status_code == 200 and again.json()["deduped"] == "true"
    messages = ChannelMessage.objects.filter(channel="inbox-hooks")
    assert [(m.payload, m.published_by) for m in messages] == [({"ping": 1}, "_system")]


def test_a_channel_delivery_to_an_undeclared_channel_is_503(hook_webs: list[str]) -> None:
    define("to-nowhere", delivery="channel", channel="undeclared-inbox")
    body = payload(ping=1)
    resp = post(hook_webs[0], "to-nowhere", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (503, "channel_unavailable")
    assert verdicts("to-nowhere") == [Verdict.REJECTED_CHANNEL]


def test_an_unknown_agent_is_a_400_and_leaves_no_dedupe_row(hook_webs: list[str]) -> None:
    define("ghost", agent="no-such-agent")
    body = payload(n=1)
    resp = post(hook_webs[0], "ghost", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (400, "invalid_run")
    assert verdicts("ghost") == [Verdict.REJECTED_SPAWN_SETUP]
    assert not WebhookDelivery.objects.filter(webhook_name="ghost", first=True).exists()


def test_sync_mode_answers_with_the_terminal_status(hook_webs: list[str], stack: Any) -> None:
    define("sync-ok", sync_response={"enabled": True, "timeout_ms": 20_000})
    body = payload(q="hi")
    resp = post(hook_webs[1], "sync-ok?sync=true", body, github(body))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["status"] == "completed" and Run.objects.get(id=out["run_id"]).agent_id == out["agent_id"]


def test_sync_mode_times_out_with_504(hook_webs: list[str], stack: Any) -> None:
    define("sync-slow", agent="slow", sync_response={"enabled": True, "timeout_ms": 300})
    body = payload(q="hi")
    started = time.monotonic()
    resp = post(hook_webs[0], "sync-slow?sync=true", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (504, "sync_timeout")
    assert time.monotonic() - started < 2.0  # answered at the deadline, not when the 2.5 s run ended
    run_id = resp.json()["details"]["run_id"]
    assert verdicts("sync-slow") == [Verdict.ACCEPTED, Verdict.TIMEOUT]
    wait_status(run_id, "completed")


def test_sync_requested_without_sync_response_is_503(hook_webs: list[str]) -> None:
    define("no-sync")
    body = payload(q="hi")
    resp = post(hook_webs[0], "no-sync?sync=true", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (503, "sync_unavailable")


# --- unauthenticated mode -------------------------------------------------------------


def test_auth_none_answers_only_in_unauthenticated_mode(hook_webs: list[str], open_hook_web: str, stack: Any) -> None:
    define("open-door", auth={"kind": "none"})
    body = payload(n=1)
    refused = post(hook_webs[0], "open-door", body)
    assert (refused.status_code, refused.json()["code"]) == (503, "unauthenticated_mode_disabled")
    assert post(open_hook_web, "open-door", body).status_code == 202
    assert post(open_hook_web, "sig-none-hmac", body).status_code == 404


def test_unauthenticated_mode_still_checks_signed_webhooks(open_hook_web: str) -> None:
    define("still-signed")
    body = payload(n=1)
    assert post(open_hook_web, "still-signed", body).status_code == 401


# --- rate limit -----------------------------------------------------------------------


def test_the_rate_limit_is_shared_by_both_web_processes(hook_webs: list[str], stack: Any) -> None:
    define("limited", rate_limit={"requests_per_minute": 1, "burst": 3})
    answers = []
    for i in range(6):
        body = payload(n=i)
        answers.append(post(hook_webs[i % 2], "limited", body, github(body)))
    assert [a.status_code for a in answers] == [202, 202, 202, 429, 429, 429]
    assert all(a.json()["code"] == "rate_limited" and int(a.headers["Retry-After"]) >= 1 for a in answers[3:])
    recorded = verdicts("limited")
    replays = [post(hook_webs[i % 2], "limited", payload(n=0), github(payload(n=0))) for i in range(5)]
    assert [r.status_code for r in replays] == [200] * 5  # a replay is answered whatever the rate,
    assert verdicts("limited") == recorded  # but over the limit it writes nothing (it got no token)


# --- records and admin routes ---------------------------------------------------------


def test_admin_routes_list_recent_deliveries_and_dry_run(hook_webs: list[str]) -> None:
    admin = tokens.token_create(name="wh-admin", tenant_id="ops", scopes=["substrate:admin"])["token"]
    member = tokens.token_create(name="wh-member", tenant_id="acme", scopes=["substrate:tenant"])["token"]
    define("triage", payload_mapping={"goal": "$.t", "user_id": "$.u", "user_credentials.k": "$.k"})
    good = payload(t="hello", u="u1", k="secret-value")
    post(hook_webs[0], "triage", good, github(good))
    post(hook_webs[0], "triage", good)
    as_admin = {"Authorization": f"Bearer {admin}"}
    recent = httpx.get(f"{hook_webs[1]}/v1/_webhooks/triage/recent-deliveries?limit=10", headers=as_admin)
    assert recent.status_code == 200
    assert [d["verdict"] for d in recent.json()["deliveries"]] == [Verdict.REJECTED_SIG, Verdict.ACCEPTED]
    forbidden = httpx.get(
        f"{hook_webs[1]}/v1/_webhooks/triage/recent-deliveries", headers={"Authorization": f"Bearer {member}"}
    )
    assert forbidden.status_code == 403
    dry = httpx.post(f"{hook_webs[1]}/v1/_webhooks/triage/test", content=good, headers=as_admin).json()
    assert dry == {
        "would_accept": True,
        "verdict": "accepted",
        "run_input_preview": {"agent": "echo", "user_id": "u1", "goal": "hello", "credential_keys": ["k"]},
    }
    bad = httpx.post(f"{hook_webs[1]}/v1/_webhooks/triage/test", content=b"nope", headers=as_admin).json()
    assert (bad["would_accept"], bad["verdict"], bad["code"]) == (False, "rejected_mapping", "bad_mapping")
    assert WebhookDelivery.objects.filter(webhook_name="triage").count() == 2  # the dry runs recorded nothing


def test_on_complete_hooks_run_once_when_the_spawned_run_completes(hook_webs: list[str], stack: Any) -> None:
    channeldef_create(tenant_id="", name="hook-done", spec=ChannelSpec())
    hooks = [{"kind": "channel.publish", "channel": "hook-done", "payload": {"source": "ci"}}]
    define("with-hooks", on_complete=hooks)
    body = payload(q="build finished")
    first = post(hook_webs[0], "with-hooks", body, github(body))
    assert first.status_code == 202, first.text
    run_id = first.json()["run_id"]
    run = wait_status(run_id, "completed")
    message = wait_for(lambda: ChannelMessage.objects.filter(channel="hook-done").first())
    assert message.payload == {
        "webhook_name": "with-hooks",
        "run_id": run_id,
        "agent_id": run.agent_id,
        "payload": {"source": "ci"},
    }
    replay = post(hook_webs[1], "with-hooks", body, github(body))  # a replay makes no run and no second message
    assert replay.json()["deduped"] == "true"
    assert ChannelMessage.objects.filter(channel="hook-done").count() == 1
