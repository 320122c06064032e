"""The mirror's file primitives (loomcycle_http/mirror/files.py, runs.py): no stack needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomcycle_http.mirror import files
from loomcycle_http.mirror.runs import agent_dir, placeable


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_last_whole_line_is_the_resume_point(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    files.append_lines(path, [files.dumps_line({"seq": 1}), files.dumps_line({"seq": 2})])
    with path.open("a") as out:
        out.write('{"seq": 3, "ty')  # SIGKILL mid-append
    assert files.last_seq(path) == 2
    assert path.read_text() == '{"seq":1}\n{"seq":2}\n'
    files.append_lines(path, [files.dumps_line({"seq": 3})])
    assert [line["seq"] for line in files.read_lines(path)] == [1, 2, 3]


def test_write_atomic_replaces_the_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "status"
    files.write_json_atomic(path, {"state": "running"})
    files.write_json_atomic(path, {"state": "completed"})
    assert path.read_text() == '{\n  "state": "completed"\n}\n'
    assert [p.name for p in path.parent.iterdir()] == ["status"]


def test_names_that_are_not_the_apis_never_become_paths(tmp_path: Path) -> None:
    assert agent_dir(tmp_path, "team/triage") == tmp_path / "agents" / "team" / "triage"
    for bad in ("..", "../x", "/etc", "a//b", ""):
        with pytest.raises(ValueError):
            agent_dir(tmp_path, bad)
    assert placeable({"agent": "chat", "run_id": "r_1"})
    assert not placeable({"agent": "chat", "run_id": "../r"})


def test_lines_longer_than_the_read_back_chunk_are_read_and_repaired_whole(tmp_path: Path) -> None:
    """A transcript line can be far longer than files.TAIL_CHUNK (a large piped-in prompt)."""
    path = tmp_path / "transcript.ndjson"
    big = "x" * (3 * files.TAIL_CHUNK + 17)
    path.write_text(files.dumps_line({"seq": 1, "text": big}) + files.dumps_line({"seq": 2, "text": big}))
    assert files.last_line(path) == {"seq": 2, "text": big}
    whole = path.read_bytes()
    with path.open("ab") as f:  # a crash in the middle of appending another long line
        f.write(files.dumps_line({"seq": 3, "text": big}).encode()[: 2 * files.TAIL_CHUNK])
    assert files.last_seq(path) == 2 and path.read_bytes() == whole  # only the torn line was cut
    assert [line["seq"] for line in files.read_lines(path)] == [1, 2]
