"""Instance defaults that are security decisions (issue 16 items 7 and 8):
generated secrets shared by every process, the mock only on the embedded
default, Flower only behind basic auth beyond loopback, the admin never
framed, and cookies Secure over TLS."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management.base import CommandError
from django.test import Client

from loomcycle_project import env as E
from loomcycle_project import instance_secrets
from loomcycle_project.management.commands import up
from tests.procs import ROOT

PROBE = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps([s.SECRET_KEY, s.SECRET_KEY_SOURCE, s.LOOMCYCLE.operator_token_pepper, "
    "s.OPERATOR_TOKEN_PEPPER_SOURCE, s.LOOMCYCLE.mock_enabled, s.MOCK_ENABLED_SOURCE]))"
)
UNSET = (
    "DJANGO_SECRET_KEY",
    "LOOMCYCLE_OPERATOR_TOKEN_PEPPER",
    "LOOMCYCLE_MOCK_ENABLED",
    "LOOMCYCLE_EMBEDDED_POSTGRES",
)


def settings_of_a_new_process(data_dir: Path, **env: str) -> list[Any]:
    """What a freshly started process's settings say, with `env` on a clean slate."""
    base = {k: v for k, v in os.environ.items() if k not in UNSET}
    base.update(LOOMCYCLE_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="loomcycle_project.settings", **env)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=base, capture_output=True, check=True)
    result: list[Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return result


def test_generated_secrets_are_written_once_with_mode_0600_and_read_by_every_process(tmp_path: Path) -> None:
    results: list[dict[str, str]] = []
    threads = [threading.Thread(target=lambda: results.append(instance_secrets.ensure(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({json.dumps(r, sort_keys=True) for r in results}) == 1  # one winner, everyone reads it
    secrets_file = instance_secrets.path(tmp_path)
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [secrets_file.name]  # no temporary file left behind
    generated = results[0]
    assert len(generated["secret_key"]) >= 50 and len(generated["operator_token_pepper"]) >= 32
    first = settings_of_a_new_process(tmp_path)
    second = settings_of_a_new_process(tmp_path)
    assert first[:4] == second[:4] == [generated["secret_key"], "file", generated["operator_token_pepper"], "file"]


def test_the_environment_wins_over_the_generated_file(tmp_path: Path) -> None:
    instance_secrets.ensure(tmp_path)
    got = settings_of_a_new_process(tmp_path, DJANGO_SECRET_KEY="k" * 60, LOOMCYCLE_OPERATOR_TOKEN_PEPPER="")
    assert got[:4] == ["k" * 60, "env", "", "env"]


def test_a_data_directory_that_predates_the_file_keeps_an_empty_pepper(tmp_path: Path) -> None:
    (tmp_path / "pg").mkdir()  # an embedded database from before: its tokens were hashed unpeppered
    generated = instance_secrets.ensure(tmp_path)
    assert generated["operator_token_pepper"] == "" and generated["secret_key"]


def test_without_a_file_or_env_a_process_gets_a_random_key(tmp_path: Path) -> None:
    got = settings_of_a_new_process(tmp_path)
    assert got[1] == "none" and len(got[0]) >= 50 and got[2:4] == ["", "none"]
    assert not instance_secrets.path(tmp_path).exists()  # only manage.py on the embedded default writes it


def test_the_mock_is_on_for_the_embedded_default_only_unless_asked_for(tmp_path: Path) -> None:
    external = "postgres://db.internal:5432/loomcycle"
    assert settings_of_a_new_process(tmp_path, DATABASE_URL=external)[4:] == [False, "external DATABASE_URL"]
    enabled = settings_of_a_new_process(tmp_path, DATABASE_URL=external, LOOMCYCLE_MOCK_ENABLED="1")
    assert enabled[4:] == [True, "LOOMCYCLE_MOCK_ENABLED"]
    embedded = settings_of_a_new_process(tmp_path, DATABASE_URL=external, LOOMCYCLE_EMBEDDED_POSTGRES="1")
    assert embedded[4:] == [True, "embedded default"]


def test_doctor_says_where_the_secrets_and_the_mock_come_from(capsys: pytest.CaptureFixture[str], db: None) -> None:
    from django.core.management import call_command

    call_command("doctor")
    out = capsys.readouterr().out
    assert "mock provider: enabled (embedded default)" in out  # the test stack is the embedded default
    assert "secret key:" in out and "token pepper:" in out


def test_up_refuses_flower_beyond_loopback_without_basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(E, "FLOWER_ADDRESS", "0.0.0.0")
    monkeypatch.setattr(E, "FLOWER_BASIC_AUTH", "")
    with pytest.raises(CommandError, match="basic auth"):
        up.flower_child(["celery"])
    monkeypatch.setattr(E, "FLOWER_BASIC_AUTH", "ops:s3cret")
    child = up.flower_child(["celery"])
    assert "--address=0.0.0.0" in child.argv
    assert child.extra_env == {"FLOWER_BASIC_AUTH": "ops:s3cret", "LOOMCYCLE_FAST_TRANSPORT": "0"}
    assert not any("s3cret" in arg for arg in child.argv)  # never on a command line `ps` shows
    monkeypatch.setattr(E, "FLOWER_ADDRESS", "127.0.0.1")
    monkeypatch.setattr(E, "FLOWER_BASIC_AUTH", "")
    assert up.flower_child(["celery"]).extra_env == {"LOOMCYCLE_FAST_TRANSPORT": "0"}  # its broker view


def test_the_admin_is_never_framed(http: httpx.Client) -> None:
    resp = http.get("/admin/login/")
    assert resp.status_code == 200 and resp.headers["X-Frame-Options"] == "DENY"


@pytest.mark.django_db
def test_admin_cookies_are_secure_over_tls_only(settings: Any) -> None:
    plain = Client().get("/admin/login/")
    assert plain.cookies["csrftoken"]["secure"] == ""
    tls = Client().get("/admin/login/", secure=True)
    assert tls.cookies["csrftoken"]["secure"] is True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = Client().get("/admin/login/", headers={"X-Forwarded-Proto": "https"})
    assert proxied.cookies["csrftoken"]["secure"] is True
