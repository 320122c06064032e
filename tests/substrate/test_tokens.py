"""Operator tokens (SPEC 5.2 OperatorTokenDef): mint, rotate, retire, the audit
log, and the same services over REST, `manage.py token` and `manage.py init`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone

from apps.core.config import load_config
from apps.core.errors import Unauthorized
from apps.substrate import auth_cache, tokens
from apps.substrate.auth import authenticate
from apps.substrate.kinds import Refused
from apps.substrate.models import OperatorTokenDef
from loomcycle_project.management.commands.doctor import check_auth
from loomcycle_project.management.commands.init import STARTER_YAML

PEPPER = "test-pepper"


@pytest.fixture
def audit(settings: Any, tmp_path: Path) -> Path:
    """No legacy token, a pepper, and an audit log of this test's own."""
    path = tmp_path / "audit" / "audit.jsonl"
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, auth_token=None, operator_token_pepper=PEPPER, audit_log_path=str(path)
    )
    return path


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def mint(name: str, scopes: list[str] | None = None, tenant: str = "acme") -> dict[str, Any]:
    return tokens.token_create(name=name, tenant_id=tenant, scopes=scopes, by="test")


# --- services ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_create_shows_the_plaintext_once_and_stores_only_the_peppered_hash(audit: Path) -> None:
    out = mint("ci", ["runs:read"])
    token = out["token"]
    assert token.startswith("lct_") and 40 <= len(token) - 4 <= 44
    assert set(token[4:]) <= set(tokens._B58) and out["token_suffix"] == token[4:10]
    assert out["warning"] and out["subject"] == "tok-ci" and out["scopes"] == ["runs:read"]
    row = OperatorTokenDef.objects.get(id=out["def_id"])
    assert row.token_hash == hashlib.sha256((PEPPER + token).encode()).hexdigest()  # hex, no prefix
    stored = json.dumps(list(OperatorTokenDef.objects.values().get(id=row.id).values()), default=str)
    assert token not in stored and token[4:] not in stored
    for shown in (tokens.token_get(def_id=row.id), tokens.token_list(name="ci")):
        text = json.dumps(shown)
        assert token not in text and row.token_hash not in text and "token" not in shown
    [line] = audit_lines(audit)
    assert (line["op"], line["name"], line["tenant_id"], line["by"]) == ("create", "ci", "acme", "test")
    assert token not in audit.read_text() and row.token_hash not in audit.read_text()
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600


@pytest.mark.django_db
def test_create_defaults_to_an_admin_token_in_the_given_tenant(audit: Path) -> None:
    out = mint("ops")
    assert out["scopes"] == ["substrate:admin"] and out["imported"] is False
    principal = authenticate(out["token"], "192.0.2.10")
    assert (principal.tenant_id, principal.subject, principal.is_admin) == ("acme", "tok-ops", True)


@pytest.mark.django_db
def test_create_on_a_live_name_is_refused_with_a_pointer_to_rotate(audit: Path) -> None:
    mint("ci")
    with pytest.raises(Refused, match="use rotate"):
        mint("ci", tenant="beta")
    assert OperatorTokenDef.objects.filter(name="ci").count() == 1 and len(audit_lines(audit)) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "bad name"}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"tenant_id": ""}, "tenant_id"),
        ({"tenant_id": "a/b"}, "tenant_id"),
        ({"scopes": ["runs:read", "root"]}, "unknown scope"),
        ({"scopes": []}, "at least one"),
        ({"scopes": "runs:read"}, "list of strings"),
        ({"scopes": ["runs:read"] * 2 + [f"x{i}" for i in range(64)]}, "at most 64"),
        ({"subject": "has space"}, "subject"),
        ({"import_token": "short"}, "import_token"),
    ],
)
@pytest.mark.django_db
def test_create_validates_every_field(audit: Path, fields: dict[str, Any], message: str) -> None:
    body = {"name": "ok", "tenant_id": "acme", **fields}
    with pytest.raises(Refused, match=message):
        tokens.token_create(**body)
    assert not OperatorTokenDef.objects.exists()


@pytest.mark.django_db
def test_an_imported_token_authenticates_and_is_marked_imported(audit: Path) -> None:
    out = tokens.token_create(name="old", tenant_id="acme", import_token="legacy-secret-123", scopes=["runs:read"])
    assert out["imported"] is True and out["token"] == "legacy-secret-123" and out["token_suffix"] == "legacy"
    assert authenticate("legacy-secret-123", "192.0.2.10").scopes == frozenset({"runs:read"})
    with pytest.raises(Refused, match="already registered"):
        tokens.token_create(name="dup", tenant_id="acme", import_token="legacy-secret-123")


@pytest.mark.django_db
def test_rotate_keeps_the_old_token_valid_until_the_grace_ends_then_401(audit: Path) -> None:
    old = mint("ci", ["runs:read"])
    new = tokens.token_rotate(name="ci", grace_seconds=3600, by="test")
    assert new["rotated_from"] == old["def_id"] and new["token"] != old["token"]
    assert (new["name"], new["tenant_id"], new["scopes"]) == ("ci", "acme", ["runs:read"])
    retires_at = OperatorTokenDef.objects.get(id=old["def_id"]).retired_at
    assert retires_at is not None and new["prior_retires_at"].startswith(retires_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert timedelta(seconds=3590) < retires_at - timezone.now() <= timedelta(seconds=3600)
    assert authenticate(old["token"], "192.0.2.10").subject == "tok-ci"  # inside the grace
    assert authenticate(new["token"], "192.0.2.10").subject == "tok-ci"
    OperatorTokenDef.objects.filter(id=old["def_id"]).update(retired_at=timezone.now() - timedelta(seconds=1))
    # The grace "ended" by editing the row, not by waiting: the lookup cache,
    # whose entries never outlive retired_at, must forget what it knew.
    auth_cache.forget_local()
    with pytest.raises(Unauthorized):
        authenticate(old["token"], "192.0.2.10")  # the grace is over
    assert authenticate(new["token"], "192.0.2.10").subject == "tok-ci"
    states = {t["def_id"]: t["state"] for t in tokens.token_list(name="ci")["tokens"]}
    assert states == {old["def_id"]: "retired", new["def_id"]: "live"}
    assert [line["op"] for line in audit_lines(audit)] == ["create", "rotate"]
    with pytest.raises(Refused, match="already retired or rotating"):
        tokens.token_rotate(def_id=old["def_id"])


@pytest.mark.django_db
def test_rotate_grace_defaults_to_the_configured_setting(audit: Path, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, operator_token_rotation_grace_seconds=120)
    old = mint("ci")
    tokens.token_rotate(def_id=old["def_id"])
    retired_at = OperatorTokenDef.objects.get(id=old["def_id"]).retired_at
    assert retired_at is not None and timedelta(seconds=110) < retired_at - timezone.now() <= timedelta(seconds=120)
    with pytest.raises(Refused, match="grace_seconds"):
        tokens.token_rotate(name="ci", grace_seconds=-1)


@pytest.mark.django_db
def test_retire_is_immediate_and_retiring_twice_has_one_effect(audit: Path) -> None:
    mint("ops")  # another admin token, so "ci" is not the last one
    out = mint("ci")
    first = tokens.token_retire(name="ci", by="test")
    assert first["retired"] is True and first["already_retired"] is False and first["state"] == "retired"
    with pytest.raises(Unauthorized):
        authenticate(out["token"], "127.0.0.1")
    again = tokens.token_retire(def_id=out["def_id"])
    assert again["already_retired"] is True and again["retired_at"] == first["retired_at"]
    assert [line["op"] for line in audit_lines(audit)] == ["create", "create", "retire"]
    with pytest.raises(Refused, match="no live token"):
        tokens.token_retire(name="ci")
    mint("ci")  # the name is free again


@pytest.mark.django_db
def test_the_last_live_admin_token_cannot_be_retired_without_a_legacy_token(audit: Path, settings: Any) -> None:
    admin = mint("ops")
    mint("reader", ["runs:read"])
    with pytest.raises(Refused, match="last live admin token"):
        tokens.token_retire(name="ops")
    rotated = tokens.token_rotate(name="ops", grace_seconds=600)  # the old one is now rotating, not live
    with pytest.raises(Refused, match="last live admin token"):
        tokens.token_retire(def_id=rotated["def_id"])
    assert tokens.token_retire(def_id=admin["def_id"])["retired"] is True  # the rotating one may go
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token="legacy-env-token")
    assert tokens.token_retire(def_id=rotated["def_id"])["retired"] is True  # the env token remains


@pytest.mark.django_db
def test_the_database_allows_one_live_token_per_name(audit: Path) -> None:
    mint("ci")
    with pytest.raises(IntegrityError), transaction.atomic():
        OperatorTokenDef.objects.create(id="def_x", name="ci", tenant_id="t", subject="s", token_hash="0" * 64)


@pytest.mark.django_db(transaction=True)
def test_concurrent_mints_of_one_name_give_one_token(audit: Path) -> None:
    results: list[str] = []
    barrier = threading.Barrier(4)

    def attempt() -> None:
        barrier.wait()
        try:
            mint("race")
            results.append("ok")
        except Refused:
            results.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "refused", "refused", "refused"]
    assert OperatorTokenDef.objects.filter(name="race").count() == 1


@pytest.mark.django_db
def test_an_unwritable_audit_log_fails_the_op_and_mints_nothing(audit: Path, settings: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, audit_log_path=str(blocker / "audit.jsonl"))
    with pytest.raises(tokens.AuditLogUnavailable):
        mint("ci")
    assert not OperatorTokenDef.objects.exists()


# --- REST: POST /v1/_operatortokendef ------------------------------------------------------


def post_op(client: Client, token: str, body: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    return client.post("/v1/_operatortokendef", data=body, content_type="application/json", headers=headers)


@pytest.mark.django_db(transaction=True)
def test_operatortokendef_op_dispatch_over_rest(audit: Path, client: Client) -> None:
    admin = mint("root")["token"]
    created = post_op(client, admin, {"op": "create", "name": "ci", "tenant_id": "beta", "scopes": ["runs:create"]})
    assert created.status_code == 200, created.content
    body = created.json()
    assert body["token"].startswith("lct_") and body["tenant_id"] == "beta" and body["warning"]
    assert OperatorTokenDef.objects.get(id=body["def_id"]).created_by == "tok-root"
    listed = post_op(client, admin, {"op": "list", "name": "ci"}).json()
    assert listed["name"] == "ci" and [t["def_id"] for t in listed["tokens"]] == [body["def_id"]]
    assert body["token"] not in json.dumps(listed)
    got = post_op(client, admin, {"op": "get", "def_id": body["def_id"]}).json()
    assert got["subject"] == "tok-ci" and "token" not in got
    rotated = post_op(client, admin, {"op": "rotate", "name": "ci", "grace_seconds": 0}).json()
    assert rotated["rotated_from"] == body["def_id"] and rotated["prior_retires_at"]
    retired = post_op(client, admin, {"op": "retire", "def_id": rotated["def_id"]}).json()
    assert retired["retired"] is True
    names = client.get("/v1/_operatortokendef/names", headers={"Authorization": f"Bearer {admin}"}).json()["names"]
    ci = next(n for n in names if n["name"] == "ci")
    assert (ci["version_count"], ci["live_version_count"], ci["active_def_id"]) == (2, 0, "")
    assert ci["active_retired"] is True
    assert next(n for n in names if n["name"] == "root")["live_version_count"] == 1


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"op": "create", "name": "root", "tenant_id": "acme"}, 422, "tool_refused"),
        ({"op": "explode"}, 422, "tool_refused"),
        ({"op": "get", "def_id": "def_0000000000000000"}, 422, "tool_refused"),
        ({"op": "retire", "name": "root"}, 422, "tool_refused"),
        ({"op": "create", "name": "x", "tenant_id": "acme", "scope": ["runs:read"]}, 400, "invalid_body"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_operatortokendef_refusals_are_422_tool_refused(
    audit: Path, client: Client, body: dict[str, Any], status: int, code: str
) -> None:
    admin = mint("root")["token"]
    resp = post_op(client, admin, body)
    assert resp.status_code == status, resp.content
    assert resp.json()["code"] == code
    if code == "tool_refused":
        assert resp.json()["tool"] == "OperatorTokenDef" and resp.json()["error"]


# --- CLI: manage.py token / init / doctor --------------------------------------------------


def run_command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_manage_py_token_create_list_rotate_revoke(audit: Path) -> None:
    created = run_command("token", "create", "--name", "ci", "--tenant", "acme", "--scopes", "runs:read, runs:create")
    token = created.strip().splitlines()[-1]
    assert token.startswith("lct_") and created.count(token) == 1
    principal = authenticate(token, "192.0.2.10")
    assert principal.scopes == frozenset({"runs:read", "runs:create"}) and principal.tenant_id == "acme"
    listed = run_command("token", "list")
    assert "ci" in listed and token not in listed and token[4:10] in listed
    as_json = json.loads(run_command("token", "list", "--json"))
    assert [t["name"] for t in as_json["tokens"]] == ["ci"]
    rotated = run_command("token", "rotate", "--name", "ci", "--grace-seconds", "0")
    new_token = rotated.strip().splitlines()[-1]
    assert new_token.startswith("lct_") and new_token != token and "stays valid until" in rotated
    with pytest.raises(Unauthorized):
        authenticate(token, "192.0.2.10")
    assert "retired at" in run_command("token", "revoke", "--name", "ci")
    with pytest.raises(Unauthorized):
        authenticate(new_token, "192.0.2.10")
    with pytest.raises(CommandError, match="--tenant is required"):
        run_command("token", "create", "--name", "x")
    with pytest.raises(CommandError, match="unknown scope"):
        run_command("token", "create", "--name", "x", "--tenant", "acme", "--scopes", "root")


@pytest.mark.django_db
def test_manage_py_init_writes_a_loadable_starter_and_refuses_to_overwrite(
    audit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_command("init")
    config = tmp_path / "loomcycle.yaml"
    assert config.read_text() == STARTER_YAML
    assert load_config([config])["agents"]["hello"]["provider"] == "mock"
    with pytest.raises(CommandError, match="--force"):
        run_command("init")
    config.write_text("# edited\n")
    run_command("init", "--force")
    assert config.read_text() == STARTER_YAML


@pytest.mark.django_db
def test_manage_py_init_with_token_writes_a_0600_env_file_with_a_working_token(
    audit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = run_command("init", "--with-token")
    env_file = tmp_path / ".loomcycle.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    key, _, token = env_file.read_text().strip().partition("=")
    assert key == "LOOMCYCLE_TOKEN" and token.startswith("lct_") and token not in out
    principal = authenticate(token, "192.0.2.10")
    assert principal.is_admin and principal.tenant_id == "default"
    assert "Authorization: Bearer $LOOMCYCLE_TOKEN" in out
    (tmp_path / "loomcycle.yaml").unlink()
    with pytest.raises(CommandError, match=r"\.loomcycle\.env"):
        run_command("init", "--with-token")  # the env file alone blocks a second mint
    with pytest.raises(CommandError, match="rotate"):
        run_command("init", "--with-token", "--force")  # "admin" is live: refused, old file kept
    assert env_file.read_text().strip() == f"LOOMCYCLE_TOKEN={token}"
    assert sorted(os.listdir(tmp_path)) == [".loomcycle.env", "audit"]


@pytest.mark.django_db
def test_doctor_reports_open_mode_pepper_and_the_legacy_token(audit: Path, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, operator_token_pepper="")
    lines = {(name, level) for level, name, _ in check_auth()}
    assert {("auth", "WARN"), ("auth pepper", "WARN"), ("auth tokens", "PASS"), ("audit log", "PASS")} <= lines
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token="legacy-env-token")
    assert ("auth legacy", "PASS") in {(name, level) for level, name, _ in check_auth()}
    mint("ops")
    checks = {name: (level, detail) for level, name, detail in check_auth()}
    assert checks["auth legacy"][0] == "WARN" and "disabled" in checks["auth legacy"][1]
    assert checks["auth tokens"] == ("PASS", "1 live operator token(s), 1 with substrate:admin")
    assert "auth" not in checks  # not open mode


@pytest.mark.django_db
def test_doctor_warns_when_tokens_exist_but_no_admin_credential_does(audit: Path, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token=None)
    tokens.token_create(name="acme-bot", tenant_id="acme", scopes=["substrate:tenant"])
    checks = {name: (level, detail) for level, name, detail in check_auth()}
    assert "auth" not in checks  # a tenant's token ends open mode
    assert checks["auth admin"][0] == "WARN" and "nobody can administer" in checks["auth admin"][1]
    tokens.token_create(name="ops", tenant_id="ops")
    assert "auth admin" not in {name for _, name, _ in check_auth()}
