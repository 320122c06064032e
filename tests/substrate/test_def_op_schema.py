"""The definition op's input is one schema (apps.substrate.schemas.DefOpIn) for every transport:
REST parses the body with it and the MCP server's def tools take it as their arguments."""

from __future__ import annotations

from apps.mcp.server.tools_admin import DefOpArgs
from apps.substrate.schemas import DefOpIn


def test_rest_and_mcp_parse_def_ops_with_one_schema() -> None:
    assert issubclass(DefOpArgs, DefOpIn)
    assert DefOpArgs.model_json_schema()["properties"] == DefOpIn.model_json_schema()["properties"]
    body = {"op": "add_hook", "def_id": "d1", "hook": {"kind": "channel.publish"}}  # a kind's own op and field
    assert DefOpArgs.model_validate(body).model_dump(exclude_unset=True) == body
    assert DefOpIn.model_validate(body).model_dump(exclude_unset=True) == body
