"""loomcycle_testing: a pytest plugin for testing agents on a real loomcycle runtime.

Load it with `pytest -p loomcycle_testing` (an installed loomcycle registers
it as a pytest11 entry point under the same name, so `-p` and the entry
point never load it twice). See docs/testing.md.

It is a package of its own, not `loomcycle_project.testing`: importing
anything under `loomcycle_project` runs the runtime's Celery setup, which
sets DJANGO_SETTINGS_MODULE and connects Celery signal handlers in the
importing process, and a user's pytest process may be a different Django
project. This package imports only pytest, httpx (and httpx-sse) and the standard library
(an import-linter contract in pyproject.toml keeps it so).
"""

from loomcycle_testing.client import (
    LoomcycleError,
    Result,
    RunTimeout,
    ToolCall,
    assert_tool_called,
    define_agent,
    run_agent,
    send_input,
)
from loomcycle_testing.plugin import (
    assert_tool_called_fixture,
    define_agent_fixture,
    loomcycle_client,
    loomcycle_runtime,
    pytest_addoption,
    run_agent_fixture,
    send_input_fixture,
)
from loomcycle_testing.runtime import Runtime, RuntimeStartError

__all__ = [
    "LoomcycleError",
    "Result",
    "RunTimeout",
    "Runtime",
    "RuntimeStartError",
    "ToolCall",
    "assert_tool_called",
    "assert_tool_called_fixture",
    "define_agent",
    "define_agent_fixture",
    "loomcycle_client",
    "loomcycle_runtime",
    "pytest_addoption",
    "run_agent",
    "run_agent_fixture",
    "send_input",
    "send_input_fixture",
]
