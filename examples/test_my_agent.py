"""A user's test of their own agent, against a real loomcycle runtime.

Run it with:  pytest -p loomcycle_http.testing test_my_agent.py
"""

import json

from loomcycle_http.testing import assert_tool_called

# What the `mock-script` model does, step by step: call Memory, then answer.
SCRIPT = [
    {"tool": "Memory", "input": {"op": "set", "scope": "user", "key": "colour", "value": "blue"}},
    {"text": "Saved."},
]


def test_the_agent_remembers_the_colour(define_agent, run_agent, loomcycle_client):
    define_agent(
        "colour-keeper",
        provider="mock",
        model="mock-script",
        system_prompt="Remember what the user tells you.",
        tools=["Memory"],
        memory_scopes=["user"],
    )

    result = run_agent("colour-keeper", "Remember my colour. MOCK_SCRIPT: " + json.dumps(SCRIPT), user_id="alice")

    assert result.status == "completed"
    assert_tool_called(result, "Memory", op="set", key="colour", value="blue")
    assert result.text == "Saved."
    assert loomcycle_client.memory.get("user", "alice", "colour") == "blue"  # a loomcycle_http Client
