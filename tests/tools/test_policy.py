"""SPEC 6.1's three layers for the network tools, SPEC 8's postures and what
`doctor` says about them."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from django.core.management import call_command

from apps.core import hosts
from apps.core import toolregistry as registry
from apps.runs.prompt import Segment
from apps.runs.services import RunCreate, run_resolve
from apps.tools.posture import Posture, posture
from loomcycle_project.management.commands.doctor import check_tools

OP = ("example.com", "api.test")


def configure(settings: Any, operator: tuple[str, ...], authoritative: bool = False) -> None:
    """The network settings; the filesystem as each posture has it: the sandbox with no
    volume (only loomcycle.yaml, which declares none) and Bash off, the open network with
    the test yaml's rw volumes and Bash on, unsandboxed (posture B)."""
    open_network = "*" in operator
    every = os.environ["LOOMCYCLE_CONFIG_FILES"].split(",")  # the suite's layers (pytest_plugin)
    files = [p for p in every if open_network or p.endswith("/loomcycle.yaml")]
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        http_host_allowlist=operator,
        http_caller_authoritative=authoritative,
        config_files=tuple(files),
        bash_enabled=open_network,
        bash_unsandboxed=open_network,
        volumes_root=settings.LOOMCYCLE.volumes_root if open_network else "",
    )


@pytest.mark.parametrize(
    ("operator", "authoritative", "caller", "expected"),
    [
        # Not configured: nothing, whatever the caller says.
        ((), False, None, ()),
        ((), False, ["example.com"], ()),
        # Operator list: omitted = it, [] = nothing, a list = the intersection (suffix match both sides).
        (OP, False, None, OP),
        (OP, False, [], ()),
        (OP, False, ["docs.example.com", "evil.test"], ("docs.example.com",)),
        (OP, False, ["com"], ("example.com",)),
        (OP, False, ["*"], OP),
        (("*",), False, ["a.test", "b.test."], ("a.test", "b.test")),
        (OP, False, ["evilexample.com"], ()),
        # Caller-authoritative: omitted = nothing; a list is the caller's, within a set operator list.
        ((), True, None, ()),
        ((), True, [], ()),
        ((), True, ["a.test", ".b.test"], ("a.test", "b.test")),
        (OP, True, ["docs.example.com", "evil.test"], ("docs.example.com",)),
        (OP, True, None, ()),
    ],
)
def test_run_allowed_hosts_matrix(
    settings: Any,
    operator: tuple[str, ...],
    authoritative: bool,
    caller: list[str] | None,
    expected: tuple[str, ...],
) -> None:
    configure(settings, operator, authoritative)
    assert hosts.run_allowed_hosts(caller) == expected


@pytest.mark.parametrize(
    ("entry", "ok"),
    [
        ("example.com", True),
        (".example.com", True),
        ("example.com.", True),
        ("*", True),
        ("10.0.0.1", True),
        ("::1", True),
        ("", False),
        ("exa mple.com", False),
        ("*.example.com", False),
        ("http://example.com", False),
        ("-bad.com", False),
    ],
)
def test_host_entries_are_names_addresses_or_a_star(entry: str, ok: bool) -> None:
    assert (hosts.host_entry_error(entry) is None) is ok


@pytest.mark.usefixtures("agents")
def test_a_resolved_run_carries_its_hosts_and_its_tools(settings: Any) -> None:
    configure(settings, ("localhost", "127.0.0.1"))

    def resolve(**kw: Any) -> Any:
        return run_resolve(tenant_id="", data=RunCreate(agent="fetcher", segments=[Segment(text="hi")], **kw))

    assert resolve().allowed_hosts == ["localhost", "127.0.0.1"]
    assert resolve(allowed_hosts=[]).allowed_hosts == []
    assert resolve(allowed_hosts=["localhost", "other.test"]).allowed_hosts == ["localhost"]
    assert resolve().tools == ["Agent", "Context", "HTTP", "WebFetch"]
    assert resolve(tools=["Web*"]).tools == ["WebFetch"]


@pytest.mark.parametrize(
    ("operator", "agent", "caller", "disable_context", "expected"),
    [
        (["*"], [], None, False, ["Context"]),  # an empty agent list: no tools but Context
        (["*"], [], None, True, []),
        (["*"], ["Web*"], None, True, ["WebFetch", "WebSearch"]),  # a trailing-* glob
        (["*"], ["*"], ["HTTP", "Context"], False, ["Context", "HTTP"]),  # the caller narrows
        (["*"], ["HTTP"], ["HTTP", "WebFetch"], True, ["HTTP"]),  # and never widens
        (["Context", "Memory"], ["HTTP", "Memory"], None, False, ["Context", "Memory"]),  # operator floor
        (["*"], ["HTTP*x"], None, True, []),  # a * inside a name is literal
    ],
)
def test_effective_tools_layers(
    operator: list[str], agent: list[str], caller: list[str] | None, disable_context: bool, expected: list[str]
) -> None:
    got = registry.effective_tools(operator=operator, agent=agent, caller=caller, disable_context=disable_context)
    assert got == expected


def test_postures_follow_the_settings(settings: Any) -> None:
    configure(settings, ())
    assert posture() is Posture.MANAGED_SANDBOX  # nothing configured: every world tool refuses
    configure(settings, (), authoritative=True)
    assert posture() is Posture.MANAGED_SANDBOX  # SPEC 8's managed sandbox
    configure(settings, ("*",))
    assert posture() is Posture.AGENTIC_DEV
    configure(settings, ("example.com",))
    assert posture() is Posture.CUSTOM


def tool_lines() -> dict[str, str]:
    return {name: detail for _, name, detail in check_tools()}


def test_doctor_names_the_posture_and_what_each_tool_may_do(
    settings: Any, capsys: pytest.CaptureFixture[str], db: None
) -> None:
    configure(settings, (), authoritative=True)
    call_command("doctor")
    out = capsys.readouterr().out
    assert "posture: managed-sandbox" in out
    assert "tool HTTP: only the hosts each run's caller lists in allowed_hosts; none when omitted" in out
    assert "tool WebFetch: only the hosts each run's caller lists in allowed_hosts" in out
    configure(settings, ("*",))
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("intranet.test",))
    lines = tool_lines()
    assert lines["posture"].startswith("agentic-dev")
    assert lines["tool HTTP"] == (
        "* (a caller's allowed_hosts narrows it); non-public addresses refused except for intranet.test"
    )
    configure(settings, ())
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, tools_enabled=("Context",))
    lines = tool_lines()
    assert lines["tool HTTP"] == "off: not in LOOMCYCLE_TOOLS_ENABLED"
    assert lines["tool Context"].startswith("for agents that list it in tools:")


def test_doctor_says_what_the_file_tools_and_bash_may_do(settings: Any) -> None:
    configure(settings, (), authoritative=True)
    lines = tool_lines()
    assert lines["tool Read"] == "only volumes an agent binds: no static volume; no dynamic or ephemeral volumes"
    assert lines["tool Bash"] == "refuses every call: not configured (LOOMCYCLE_BASH_ENABLED is off)"
    configure(settings, ("*",))
    lines = tool_lines()
    assert lines["tool Write"].startswith("only volumes an agent binds: static volumes work (rw), outside (rw)")
    assert "NOT a sandbox" in lines["tool Bash"]


def test_doctor_says_whether_bash_is_sandboxed_or_refused(settings: Any) -> None:
    configure(settings, ("*",))
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_unsandboxed=False, bash_tenants=("acme",))
    assert tool_lines()["tool Bash"].startswith("runs /bin/sh in a bubblewrap sandbox: only the bound volumes")
    assert tool_lines()["tool Bash"].endswith("for agents of the operator's yaml and tenants acme")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_bwrap="/nonexistent/bwrap")
    assert tool_lines()["tool Bash"].startswith("refuses every call: Bash runs each command in a sandbox")
    assert "`bubblewrap`" in tool_lines()["tool Bash"]
