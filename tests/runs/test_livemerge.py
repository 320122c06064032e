"""The live-text merge of one connection (apps.runs.livemerge), the worker's safe cut
(apps.runs.livetokens.safe_cut) and the client's re-attach view (loomcycle_http.client.live):
pure state machines, driven frame by frame."""

from __future__ import annotations

from typing import Any

from apps.core.redact import Redactor
from apps.runs.livemerge import VOID_REASON, LiveMerge
from apps.runs.livetokens import Snapshot, safe_cut
from apps.runs.streams import coalesced
from loomcycle_http.client.events import Event
from loomcycle_http.client.live import LiveText


def piece(step: int, gen: str, offset: int, text: str, kind: str = "text") -> dict[str, Any]:
    return {"s": step, "g": gen, "k": kind, "o": offset, "x": text, "t": 0.0}


def texts(outs: list[Any]) -> list[tuple[str, str, int | None]]:
    return [(e, d.get("text", d.get("retry", {}).get("reason", "")), s) for e, d, s in outs]


def test_live_pieces_then_the_committed_rest() -> None:
    m = LiveMerge()
    assert m.settle(0) == []
    outs, ok = m.delta(piece(0, "g1", 0, "Hello "))
    assert ok and texts(outs) == [("text", "Hello ", None)]
    outs, ok = m.delta(piece(0, "g1", 0, "Hello "))  # a duplicate is skipped
    assert ok and outs == []
    assert m.committed("text", {"type": "text", "text": "Hello world"}, 7) == (
        "text",
        {"type": "text", "text": "world"},
        7,
    )
    assert m.settle(1) == []  # confirmed: nothing to void


def test_a_gap_asks_for_the_snapshot_which_fills_it_exactly() -> None:
    m = LiveMerge()
    m.delta(piece(2, "g", 0, "ab "))
    outs, ok = m.delta(piece(2, "g", 6, "ef "))
    assert not ok and outs == []
    outs = m.snapshot(Snapshot(2, "g", {"text": "ab cd ef ", "thinking": ""}))
    assert texts(outs) == [("text", "cd ef ", None)]
    outs, ok = m.delta(piece(2, "g", 6, "ef gh "))  # overlaps what the snapshot gave
    assert ok and texts(outs) == [("text", "gh ", None)]


def test_another_attempt_of_the_call_voids_the_pending_text() -> None:
    m = LiveMerge()
    m.delta(piece(3, "old", 0, "partial "))
    outs, ok = m.delta(piece(3, "new", 0, "fresh "))
    assert ok and texts(outs) == [("retry", VOID_REASON, None), ("text", "fresh ", None)]
    assert outs[0][1]["retry"]["discarded_chars"] == {"text": 8, "thinking": 0}
    stale, ok = m.delta(piece(2, "older", 0, "stale "))  # a step below the one shown: a stale worker
    assert ok and stale == []


def test_a_step_that_commits_without_the_text_voids_it() -> None:
    m = LiveMerge()
    m.delta(piece(0, "g", 0, "doomed "))
    assert m.committed("error", {"type": "error", "error": "x"}, 5)[0] == "error"
    assert texts(m.settle(1)) == [("retry", VOID_REASON, None)]
    outs, ok = m.delta(piece(0, "g", 7, "late "))  # the committed step's late piece
    assert ok and outs == []


def test_a_committed_text_that_differs_is_sent_whole_after_a_void() -> None:
    m = LiveMerge()
    m.delta(piece(0, "g", 0, "one "))
    assert texts(m.voided_before("text", {"text": "two"})) == [("retry", VOID_REASON, None)]
    assert m.committed("text", {"type": "text", "text": "two"}, 4)[1]["text"] == "two"


def test_the_safe_cut_holds_back_the_last_word_and_a_spaced_secrets_prefix() -> None:
    plain = Redactor({}, patterns=True)
    assert safe_cut("Hello wor", plain) == 6
    assert safe_cut("nospace", plain) == 0
    spaced = Redactor({"PASS": "open sesame now"}, patterns=False)
    assert safe_cut("say open ", spaced) == 0  # "open " may begin the secret
    assert safe_cut("say hello ", spaced) == 10
    shown = plain.text("key sk-abcdefghijklmnopqrstu and "[: safe_cut("key sk-abcdefghijklmnopqrstu and ", plain)])
    assert "sk-abc" not in shown


def test_the_client_skips_what_it_has_after_a_reattach_and_voids_what_differs() -> None:
    live = LiveText()
    shown = [e for f in (Event("text", {"text": "ab "}), Event("text", {"text": "cd "})) for e in live.feed(f)]
    live.reconnected()
    again = [Event("text", {"text": "ab cd "}), Event("text", {"text": "ef "}), Event("text", {"text": "g"}, 9)]
    shown += [e for f in again for e in live.feed(f)]
    assert "".join(e.text for e in shown if e.type == "text") == "ab cd ef g"
    live.reconnected()  # nothing pending: nothing skipped
    assert [e.text for e in live.feed(Event("text", {"text": "h "}))] == ["h "]
    live.reconnected()
    out = live.feed(Event("text", {"text": "other"}, 12))  # the call was made again and committed differently
    assert [e.type for e in out] == ["retry", "text"] and out[1].text == "other"


def test_a_reader_behind_sends_what_piled_up_as_one_frame_per_kind() -> None:
    live = [
        ("text", {"type": "text", "text": "a ", "live": True}, None),
        ("text", {"type": "text", "text": "b ", "live": True}, None),
        ("retry", {"type": "retry", "live": True}, None),
        ("thinking", {"type": "thinking", "text": "x ", "live": True}, None),
        ("text", {"type": "text", "text": "c ", "live": True}, None),
        ("text", {"type": "text", "text": "d"}, 9),
    ]
    assert [(e, d.get("text"), s) for e, d, s in coalesced(live)] == [
        ("text", "a b ", None),
        ("retry", None, None),
        ("thinking", "x ", None),
        ("text", "c ", None),
        ("text", "d", 9),
    ]


def test_a_void_is_named_for_its_cause() -> None:
    m = LiveMerge()
    m.delta(piece(1, "a", 0, "one "))
    outs, _ = m.delta({**piece(1, "b", 0, "two "), "c": "retry"})
    assert [o[0] for o in outs] == ["retry", "text"] and outs[0][1]["retry"]["reason"] == VOID_REASON
    outs, _ = m.delta({**piece(1, "c", 0, "three "), "c": "provider_fallback"})
    assert [o[0] for o in outs] == ["provider_fallback", "text"]
    assert outs[0][1]["fallback"]["discarded_chars"] == outs[0][1]["discarded_chars"] == {"text": 4, "thinking": 0}
    outs = m.snapshot(Snapshot(1, "d", {"text": "four ", "thinking": ""}))  # a new worker: no cause
    assert [o[0] for o in outs] == ["retry", "text"]
    m.delta(piece(1, "d", 0, "four more ", kind="thinking"))
    m.committed("turn_cancelled", {"type": "turn_cancelled", "turn_cancelled": {"reason": "stop"}}, 9)
    m.committed("text", {"type": "text", "text": "four "}, 10)
    outs = m.settle(2)  # the cut turn committed its text but not the thinking shown
    assert [o[0] for o in outs] == ["turn_cancelled"] and outs[0][1]["discarded_chars"]["thinking"] == 10
