"""A2A (agent-to-agent protocol) over the official SDK (`a2a-sdk`): the server side
(agent cards, JSON-RPC tasks that are runs), mounted by loomcycle_project/asgi.py when
LOOMCYCLE_A2A_ENABLED=1. docs/a2a.md describes what a peer sees."""
