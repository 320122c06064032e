"""Every Python example in docs/extending.md runs: each block is executed, in order, in a fresh
Django process (so the example tool it registers stays out of this test process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests import procs

DOC = procs.ROOT / "docs" / "extending.md"

_RUNNER = """
import json, sys
import django
django.setup()
from apps.core import toolregistry as registry
from loomcycle_project.extend import RunContext
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "docs_extending"}
for block in blocks:
    exec(compile(block, "docs/extending.md", "exec"), namespace)
spec = registry.get("order_status")
ctx = RunContext("r_1", "acme", "u-1", "helper", 0, "c1")
print(json.dumps({
    "required": spec.input_schema["required"],
    "description": spec.description,
    "direct": namespace["order_status"](run=ctx, order_id="A-1"),
    "bad": spec.execute(ctx, {"order_id": "B-2"}).text,
    "receivers": [r.__name__ for r in [namespace.get("on_finished")] if r],
}))
"""


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_python_example_in_the_extending_doc_runs() -> None:
    blocks = python_blocks()
    assert len(blocks) == 4
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings"}
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(blocks),
        env=env,
        cwd=procs.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["required"] == ["order_id"]
    assert got["description"] == "Look up one of the user's orders and say where it is."
    assert got["direct"] == {"order_id": "A-1", "user": "u-1", "status": "shipped", "verbose": False}
    assert got["bad"] == "'B-2' is not an order number (they start with A-)"
    assert got["receivers"] == ["on_finished"]
