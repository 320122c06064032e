"""loomcycle_http.testing: a pytest plugin for testing agents on a real loomcycle runtime.

Load it with `pytest -p loomcycle_http.testing` (`pip install 'loomcycle-http[testing]'`
registers it as a pytest11 entry point under the same name, so `-p` and the entry point never
load it twice). See docs/testing.md.

It is part of the client's distribution (loomcycle-http), not the runtime's: it talks to the
runtime over HTTP only, through loomcycle_http.client, and starts it as a child process
(possibly with another environment's interpreter), so it never imports it. Importing anything
under `loomcycle_project` runs the runtime's Celery setup, which sets DJANGO_SETTINGS_MODULE and
connects Celery signal handlers in the importing process, and a user's pytest process may be a
different Django project. This package imports only pytest, loomcycle_http.client (httpx,
httpx-sse) and the standard library (import-linter contracts in pyproject.toml keep it so; the
client and the command line never import it, as it needs pytest).
"""

from loomcycle_http.testing.client import (
    LoomcycleError,
    Result,
    RunTimeout,
    ToolCall,
    assert_tool_called,
    define_agent,
    run_agent,
    send_input,
)
from loomcycle_http.testing.plugin import (
    assert_tool_called_fixture,
    define_agent_fixture,
    loomcycle_client,
    loomcycle_runtime,
    pytest_addoption,
    run_agent_fixture,
    send_input_fixture,
)
from loomcycle_http.testing.runtime import Runtime, RuntimeStartError

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
