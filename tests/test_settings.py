"""settings.LOOMCYCLE is the one channel from the environment to the apps
(loomcycle_project/settings.py, built from loomcycle_project/env.py): each
field is set by the variable its name says, and beat's periods come from it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from loomcycle_project.env import RuntimeSettings, checked_apps
from tests import procs

# Fields not read straight from one variable: computed (mock_enabled, from the
# database setting too; operator_token_pepper, from the secrets file too), or lists.
_NOT_ONE_VARIABLE = {
    "mock_enabled",
    "operator_token_pepper",
    "config_files",
    "tools_enabled",
    "http_host_allowlist",
    "http_private_host_allowlist",
    "hooks_permit_host_widen",
    "webhooks_env_allowlist",
    "scheduler_env_allowlist",
    "tracing_exporters",  # from the SDK's OTEL_* variables (env.py, "Tracing")
    "bash_tenants",  # a comma-separated list
    "data_dir",  # LOOMCYCLE_DATA_DIR, made absolute
    "tenant_credential_env",  # tenant:VARIABLE pairs
    "allowed_hosts",  # a comma-separated list
    "presets",  # a comma-separated list of embedded unit names
}

_PROBE = """
import dataclasses, json
from django.conf import settings
print(json.dumps(dataclasses.asdict(settings.LOOMCYCLE)))
"""


def variable(field: str) -> str:
    """The environment variable of a field: its name upper-cased, with LOOMCYCLE_
    in front except for the provider endpoints (ANTHROPIC_BASE_URL, ...)."""
    return field.upper() if field.endswith("_base_url") else f"LOOMCYCLE_{field.upper()}"


def sample(field: dataclasses.Field[Any], n: int) -> tuple[str, Any]:
    """A value to set the field's variable to, and what the field then holds
    (numbers differ per field, so two fields read from swapped variables fail)."""
    kind = str(field.type)
    if kind == "bool":
        return "1", True
    if kind in ("int", "float"):  # above every floor env.py sets (the gRPC byte and ms minimums: 1024)
        return str(2000 + n), 2000 + n
    return f"x-{field.name}", f"x-{field.name}"


def test_each_field_is_set_by_the_variable_its_name_says() -> None:
    fields = [f for f in dataclasses.fields(RuntimeSettings) if f.name not in _NOT_ONE_VARIABLE | {"provider_keys"}]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings", "OPENAI_API_KEY": "sk-probe"}
    expected: dict[str, Any] = {}
    for n, field in enumerate(fields):
        env[variable(field.name)], expected[field.name] = sample(field, n)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=procs.ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert {name: got[name] for name in expected} == expected
    assert got["provider_keys"]["OPENAI_API_KEY"] == "sk-probe"


def test_the_host_lists_are_read_as_comma_separated_lists() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings",
        "LOOMCYCLE_HTTP_HOST_ALLOWLIST": " example.com, ,*",
        "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST": "intranet.test,localhost",
        "LOOMCYCLE_BASH_TENANTS": "acme, ,beta",
        "LOOMCYCLE_TENANT_CREDENTIAL_ENV": "acme:LOOMCYCLE_ACME_GH, beta:LOOMCYCLE_B,acme:LOOMCYCLE_ACME_A",
        "LOOMCYCLE_ALLOWED_HOSTS": "api.example, localhost",
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=procs.ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert got["http_host_allowlist"] == ["example.com", "*"]
    assert got["http_private_host_allowlist"] == ["intranet.test", "localhost"]
    assert got["bash_tenants"] == ["acme", "beta"]
    assert got["tenant_credential_env"] == {"acme": ["LOOMCYCLE_ACME_A", "LOOMCYCLE_ACME_GH"], "beta": ["LOOMCYCLE_B"]}
    assert got["allowed_hosts"] == ["api.example", "localhost"]
    bad = {**env, "LOOMCYCLE_TENANT_CREDENTIAL_ENV": "acme"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=bad, cwd=procs.ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0 and "'acme' is not tenant:VARIABLE" in done.stderr.decode()


def test_beat_periods_come_from_the_runtime_settings() -> None:
    conf, schedule = settings.LOOMCYCLE, settings.CELERY_BEAT_SCHEDULE
    periods = {name: entry["schedule"] for name, entry in schedule.items()}
    assert periods == {
        "run-leases-sweep": conf.sweep_seconds,
        "children-report-sweep": conf.sweep_seconds,
        "run-slots-reconcile": conf.sweep_seconds,
        "runs-admission-sweep": conf.sweep_seconds,
        "memory-expired-sweep": conf.memory_sweep_ms / 1000.0,
        "channels-wake-due": conf.channels_wake_tick_ms / 1000.0,
        "channels-expired-sweep": conf.channels_sweep_ms / 1000.0,
        "interrupts-expire": conf.interruption_sweep_ms / 1000.0,
        "resident-sweep": conf.sweep_seconds,
        "gateway-audit-prune": 3600.0,
        "triggers-finished-sweep": conf.sweep_seconds,
        "budgets-wake": conf.sweep_seconds,
        "budget-holds-sweep": conf.sweep_seconds,
        "retention-sweep": float(conf.retention_sweep_seconds),
        "erasure-resume": float(conf.retention_sweep_seconds),
        "run-webhooks-sweep": conf.sweep_seconds,
        "a2a-calls-due": float(conf.a2a_call_poll_seconds),
    }  # the scheduler tick is absent: LOOMCYCLE_SCHEDULER_ENABLED is off in tests
    assert all(entry["options"]["expires"] == max(entry["schedule"], 1.0) for entry in schedule.values())


def test_the_scheduler_tick_is_in_beat_only_when_enabled() -> None:
    from workers.beat import beat_schedule

    periods = {
        "sweep_s": 15.0,
        "memory_sweep_s": 1.0,
        "channels_wake_tick_s": 1.0,
        "channels_sweep_s": 1.0,
        "interrupts_sweep_s": 5.0,
    }
    assert "schedules-tick" not in beat_schedule(**periods)
    tick = beat_schedule(**periods, scheduler_tick_s=30.0)["schedules-tick"]
    assert tick == {"task": "maintenance.schedules_tick", "schedule": 30.0, "options": {"expires": 30.0}}


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"LOOMCYCLE_WEBHOOKS_DELIVERY_RETENTION_HOURS": "0"},
            "LOOMCYCLE_WEBHOOKS_DELIVERY_RETENTION_HOURS must be at least 1 (got 0)",
        ),
        ({"LOOMCYCLE_SIGNAL_RESEND_SECONDS": "0.5"}, "LOOMCYCLE_SIGNAL_RESEND_SECONDS must be at least 1 (got 0.5)"),
        (
            {"LOOMCYCLE_INTERRUPTION_DEFAULT_TIMEOUT_MS": "120000", "LOOMCYCLE_INTERRUPTION_MAX_TIMEOUT_MS": "60000"},
            "LOOMCYCLE_INTERRUPTION_DEFAULT_TIMEOUT_MS (120000) is above LOOMCYCLE_INTERRUPTION_MAX_TIMEOUT_MS (60000)",
        ),
        ({"LOOMCYCLE_RESIDENT_MAX_CHILDREN": "0"}, "LOOMCYCLE_RESIDENT_MAX_CHILDREN must be at least 1 (got 0)"),
    ],
)
def test_a_setting_out_of_its_range_refuses_to_start(variables: dict[str, str], message: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings", **variables}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=procs.ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert message in done.stderr.decode()


def test_a_mistyped_extra_app_under_an_existing_package_is_named() -> None:
    assert checked_apps(["examples.hostapp", "examples.hostapp.apps.HostAppConfig"])
    with pytest.raises(ImproperlyConfigured, match=r"no module 'examples\.hostap'"):
        checked_apps(["examples.hostap"])
