"""More of issue 24's `loomcycle` behaviours, driven as a subprocess against a running stack:
exit code 3 for a run someone else cancelled, `ps --tenant` under an admin and a tenant token,
and `agent apply` on a name with a static yaml entry (a fork, with its version and hash)."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import RunEvent, RunStatus
from apps.substrate import tokens
from apps.substrate.models import AgentDef
from tests.cli.conftest import Web, cli, cli_argv, cli_env, json_lines, script
from tests.conftest import wait_for, wait_status
from tests.procs import ROOT

pytestmark = pytest.mark.usefixtures("agents", "stack")

ADMIN = Principal(tenant_id="", subject="ops", scopes=frozenset({"substrate:admin"}))


def test_a_run_cancelled_by_someone_else_exits_3_with_its_stop_reason(web_proc: Web) -> None:
    agent_id = f"a_{secrets.token_hex(8)}"
    argv = cli_argv("run", "--agent-id", agent_id, "scripted", script({"sleep_ms": 120_000, "text": "too late"}))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env(web_proc)
    )
    try:
        run_id = wait_for(
            lambda: (
                RunEvent.objects.filter(run__agent_id=agent_id, type="started").values_list("run_id", flat=True).first()
            ),
            timeout=30,
        )
        answer = services.run_cancel(principal=ADMIN, agent_id=agent_id, reason="an operator stopped it")
        assert answer["cancelled"] is True
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err
    assert out == ""  # the answer never came
    assert f"run {run_id} was cancelled: an operator stopped it" in err
    assert wait_status(run_id, RunStatus.CANCELLED).stop_reason == "an operator stopped it"


def test_ps_tenant_focuses_an_admin_and_never_widens_a_tenant_token(
    web_proc: Web, people: dict[str, dict[str, str]]
) -> None:
    alice, charlie = (people[who]["authorization"].removeprefix("Bearer ") for who in ("alice", "charlie"))
    admin = tokens.token_create(name="root", tenant_id="ops")["token"]  # no scopes: substrate:admin
    acme_run = json.loads(
        cli(web_proc, "run", "--background", "scripted", script({"text": "a"}), LOOMCYCLE_TOKEN=alice).stdout
    )["run_id"]
    beta_run = json.loads(
        cli(web_proc, "run", "--background", "scripted", script({"text": "b"}), LOOMCYCLE_TOKEN=charlie).stdout
    )["run_id"]

    def seen(token: str, *args: str) -> list[tuple[str, str]]:
        listed = cli(web_proc, "--token", token, "ps", "--all", "--json", *args)
        assert listed.returncode == 0, listed.stderr
        return sorted((row["run_id"], row["tenant_id"]) for row in json_lines(listed.stdout))

    both = sorted([(acme_run, "acme"), (beta_run, "beta")])
    assert seen(admin) == both  # an admin sees every tenant's runs
    assert seen(admin, "--tenant", "acme") == [(acme_run, "acme")]
    assert seen(admin, "--tenant", "beta") == [(beta_run, "beta")]
    assert seen(admin, "--tenant", "nobody") == []
    assert seen(alice, "--tenant", "beta") == [(acme_run, "acme")]  # ignored: still only its own tenant
    assert seen(charlie, "--tenant", "acme") == [(beta_run, "beta")]


def test_agent_apply_on_a_static_name_forks_it_for_the_tenant(
    web_proc: Web, people: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    alice, charlie = (people[who]["authorization"].removeprefix("Bearer ") for who in ("alice", "charlie"))
    static = AgentDef.objects.get(name="scripted", tenant_id="", source="yaml")
    spec = tmp_path / "scripted.yaml"  # the name comes from the file's stem
    spec.write_text("description: from a file\nsystem_prompt: |\n  " + script({"text": "from the fork"}) + "\n")

    applied = cli(web_proc, "--token", alice, "agent", "apply", str(spec))
    assert applied.returncode == 0, applied.stderr
    fork = AgentDef.objects.get(name="scripted", tenant_id="acme", parent__isnull=False)
    bootstrapped = AgentDef.objects.get(name="scripted", tenant_id="acme", bootstrapped_from_static=True)
    assert (bootstrapped.version, fork.version, fork.parent_id) == (1, 2, bootstrapped.id)  # a fork of the yaml entry
    assert fork.description == "from a file"
    assert applied.stdout == f"scripted v2 {fork.id} {fork.content_sha256}\n"
    assert fork.content_sha256.startswith("sha256:") and fork.content_sha256 != static.content_sha256
    merged = {**static.definition, "system_prompt": script({"text": "from the fork"})}  # the file onto the entry
    assert {k: fork.definition[k] for k in merged} == merged

    shown = cli(web_proc, "--token", alice, "agent", "show", "scripted").stdout
    assert f"content_sha256: {fork.content_sha256}" in shown and "version: 2" in shown
    assert cli(web_proc, "--token", alice, "run", "scripted", "go").stdout == "from the fork\n"  # acme's runs use it
    others = cli(web_proc, "--token", charlie, "run", "scripted", script({"text": "still the yaml entry"}))
    assert others.stdout == "still the yaml entry\n"  # another tenant's runs do not

    again = cli(web_proc, "--token", alice, "agent", "apply", str(spec))  # a fork again: the next version
    newest = AgentDef.objects.filter(name="scripted", tenant_id="acme").order_by("-version").first()
    assert newest is not None and newest.parent_id == fork.id
    assert again.stdout == f"scripted v3 {newest.id} {fork.content_sha256}\n"


def test_agent_apply_refuses_a_static_name_in_the_shared_tenant(web_proc: Web, tmp_path: Path) -> None:
    """Open mode is the shared tenant, where the yaml entry outranks every runtime version
    (SPEC 5.1): a fork there would be reported as the active version while no run used it."""
    before = sorted(AgentDef.objects.filter(name="scripted").values_list("id", flat=True))
    spec = tmp_path / "scripted.yaml"
    fields = "provider: mock\nmodel: mock-script\ntools: []\n"  # complete, so the renamed apply can create it
    spec.write_text(fields + "system_prompt: |\n  " + script({"text": "x"}) + "\n")
    refused = cli(web_proc, "agent", "apply", str(spec))
    assert refused.returncode == 4, (refused.stdout, refused.stderr)
    assert "error: static_in_shared_tenant: " in refused.stderr and "Traceback" not in refused.stderr
    assert refused.stdout == ""
    assert sorted(AgentDef.objects.filter(name="scripted").values_list("id", flat=True)) == before
    renamed = cli(web_proc, "agent", "apply", str(spec), "--name", "scripted-2")  # not static: created
    assert renamed.returncode == 0 and renamed.stdout.startswith("scripted-2 v1 "), renamed.stderr
