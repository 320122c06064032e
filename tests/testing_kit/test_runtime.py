"""The runtime side of loomcycle_http.testing, in-process: what the child's
environment holds, and the clear refusals that come before anything is
spawned (the plugin as a user runs it is tests/testing_kit/test_plugin.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from apps.core.secrets import PROVIDER_KEY_NAMES
from loomcycle_http.testing import runtime as R
from tests.procs import ROOT

MARKER = "0123456789abcdef"


def _env(tmp_path: Path, pass_env: tuple[str, ...] = ()) -> dict[str, str]:
    return R.runtime_env(tmp_path, 8123, [], pythonpath="/the/checkout", marker=MARKER, pass_env=pass_env)


def test_the_users_celery_django_and_provider_settings_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaks = {
        "CELERY_BROKER_URL": "redis://their-broker",
        "CELERY_RESULT_BACKEND": "redis://their-backend",
        "CELERY_CONFIG_MODULE": "their.celeryconfig",
        "DJANGO_SECRET_KEY": "theirs",
        "DJANGO_SETTINGS_MODULE": "their.settings",
        "DATABASE_URL": "postgresql://theirs",
        "PYTHONPATH": "/their/src",
        **{name: "sk-test-must-not-leak" for name in R.PROVIDER_ENV},
    }
    for key, value in leaks.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LOOMCYCLE_MOCK_LATENCY_MS", "7")
    env = _env(tmp_path)
    assert {k for k in leaks if k in env} == {"PYTHONPATH"} and env["PYTHONPATH"] == "/the/checkout"
    assert env["LOOMCYCLE_MOCK_LATENCY_MS"] == "7"  # a LOOMCYCLE_* setting of the user's still applies
    assert env[R.SESSION_MARKER] == MARKER and env["LOOMCYCLE_CONFIG_FILES"] == str(tmp_path / "empty.yaml")


def test_loomcycle_pass_env_passes_named_variables_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-wanted")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-named")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://wanted")
    env = _env(tmp_path, pass_env=("ANTHROPIC_API_KEY", "CELERY_BROKER_URL"))
    assert (env["ANTHROPIC_API_KEY"], env["CELERY_BROKER_URL"]) == ("sk-wanted", "redis://wanted")
    assert "OPENAI_API_KEY" not in env


def test_without_a_pythonpath_none_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/their/src")
    env = R.runtime_env(tmp_path, 8123, [], pythonpath=None, marker=MARKER)
    assert "PYTHONPATH" not in env


def test_every_provider_variable_the_runtime_reads_is_dropped() -> None:
    """The plugin cannot import the runtime, so it keeps its own list: this keeps it in step."""
    env_py = (ROOT / "loomcycle_project" / "env.py").read_text()
    base_urls = set(re.findall(r'env\.str\("([A-Z_]+_BASE_URL)"', env_py))
    assert "OLLAMA_BASE_URL" in base_urls
    assert set(PROVIDER_KEY_NAMES) | base_urls == set(R.PROVIDER_ENV)


def test_a_non_linux_platform_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(R.RuntimeStartError, match=r"on Linux only \(it uses prctl and /proc\), not on darwin"):
        R.start_runtime(tmp_path / "data", [], timeout=5)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("name", ["with:colon", "with,comma"])
def test_a_data_dir_that_cannot_be_listed_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(R.RuntimeStartError, match=r"the loomcycle data dir cannot contain ',' or ':'"):
        R.start_runtime(tmp_path / name, [], timeout=5)
    assert not (tmp_path / name).exists()


def test_loomcycle_python_that_is_not_an_interpreter_is_refused(tmp_path: Path) -> None:
    with pytest.raises(R.RuntimeStartError, match=r"loomcycle_python .*/nowhere/python is not an executable file"):
        R.start_runtime(tmp_path / "data", [], timeout=5, python=str(tmp_path / "nowhere" / "python"))


def test_loomcycle_python_that_cannot_import_the_runtime_is_refused(tmp_path: Path) -> None:
    """This interpreter finds loomcycle_project only through PYTHONPATH (it is
    not installed in .venv), which the runtime under loomcycle_python does not get."""
    with pytest.raises(R.RuntimeStartError, match=r"cannot import loomcycle_project: install loomcycle in that"):
        R.start_runtime(tmp_path / "data", [], timeout=5, python=sys.executable)


def test_the_plugins_transcript_renders_segments_as_the_runtime_does() -> None:
    """The plugin cannot import apps.runs.prompt, so it keeps its own renderer: this keeps it in step."""
    from apps.runs.prompt import UNTRUSTED_KINDS, Segment, split_segments
    from loomcycle_http.testing import transcript

    segments = [
        {"role": "user", "type": "trusted-text", "text": "plain <b>"},
        *({"role": "user", "type": "untrusted-block", "kind": k, "text": "x < y"} for k in sorted(UNTRUSTED_KINDS)),
        {"role": "user", "type": "untrusted-block", "kind": "made-up", "text": "<script>"},
        {"role": "system", "type": "trusted-text", "text": "not user text"},
    ]
    _, user = split_segments([Segment(**s) for s in segments])
    assert transcript._user_text({"segments": segments}) == user[0]["text"]
    assert transcript._UNTRUSTED_KINDS == UNTRUSTED_KINDS
