"""The kit's `Result.text` is the whole text of the last model call, though the stream shows it as
live frames and a committed frame carrying only the rest (docs/api.md, "Live text")."""

from __future__ import annotations

import pytest

from loomcycle_http.client import Client
from loomcycle_http.testing.client import run_agent, send_input
from tests.cli.conftest import script

pytestmark = pytest.mark.usefixtures("agents", "stack")
LONG = "Hello there, wide world of many words"


def test_result_text_is_the_whole_text_of_the_last_model_call(web: str) -> None:
    with Client(web, token="") as lc:
        # Sent in pieces over ~0.5 s, so live frames reach the stream before the step commits.
        result = run_agent(lc, "scripted", script({"text": LONG, "chunk_chars": 4, "chunk_ms": 50}))
        assert any(data.get("live") for event, data in result.events if event == "text")  # it did stream live
        assert result.text == LONG
        turn = run_agent(lc, "scripted", script({"text": "first turn"}, {"text": LONG}), interactive=True)
        assert (turn.status, turn.text) == ("awaiting_input", "first turn")
        assert send_input(lc, turn, "more").text == LONG  # this turn's, after the previous one's
