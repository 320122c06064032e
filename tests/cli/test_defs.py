"""`loomcycle agent apply` refuses a file it cannot read as an agent with a usage error (exit 2),
before any request: in-process (click's runner), no runtime needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loomcycle_http.cli import cli


@pytest.mark.parametrize(
    ("filename", "text", "said"),
    [
        ("bad.yaml", "model: [unclosed\n", "bad.yaml is not valid YAML"),
        ("bad.md", "---\nmodel: {oops\n---\nBe terse.\n", "bad.md: the front matter is not valid YAML"),
        ("list.yaml", "- a\n- b\n", "expected a mapping of agent fields"),
        ("entry.yaml", "agents:\n  x: 3\n", "agents.x must be a mapping"),
    ],
)
def test_a_malformed_definition_is_a_usage_error_not_a_traceback(
    tmp_path: Path, filename: str, text: str, said: str
) -> None:
    spec = tmp_path / filename
    spec.write_text(text)
    done = CliRunner().invoke(cli, ["--url", "http://127.0.0.1:9", "agent", "apply", str(spec)])
    assert done.exit_code == 2, done.output
    assert said in done.output and "Traceback" not in done.output
