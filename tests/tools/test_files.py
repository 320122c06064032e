"""The file tools against real directories (no database): traversal and symlink
escapes, a swap between check and open, ro refusal, caps, Edit's errors, Glob's
order and Grep's modes and timeout."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from apps.core.tools import ToolContext, ToolResult, VolumeBinding
from apps.runs.tools import context_execute
from apps.tools import files, fs
from apps.tools import grep as grep_module
from apps.tools.files import READ_CAP, WRITE_CAP, edit_execute, glob_execute, read_execute, write_execute
from apps.tools.grep import GREP_TIMEOUT_S, grep_execute
from tests.factories.tools import ctx_for, err, ok


@pytest.fixture
def vol(tmp_path: Path) -> Path:
    root = tmp_path / "vol"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("TOP SECRET")
    return root


def rw(root: Path) -> ToolContext:
    return ctx_for(VolumeBinding(name="work", path=str(root), mode="rw"))


def ro(root: Path) -> ToolContext:
    return ctx_for(VolumeBinding(name="work", path=str(root), mode="ro"))


# --- traversal ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../outside/secret.txt", "sub/../../outside/secret.txt", "/etc/passwd"])
def test_paths_outside_the_volume_are_refused(vol: Path, path: str) -> None:
    (vol / "sub").mkdir()
    assert "outside the volume" in err(read_execute(rw(vol), {"path": path}))
    assert "outside the volume" in err(write_execute(rw(vol), {"path": path, "content": "x"}))
    assert (vol.parent / "outside" / "secret.txt").read_text() == "TOP SECRET"


def test_an_absolute_path_inside_the_root_is_allowed(vol: Path) -> None:
    (vol / "a.txt").write_text("hello")
    assert ok(read_execute(rw(vol), {"path": str(vol / "a.txt")})) == "hello"


def test_a_symlink_pointing_out_is_refused_for_read_and_write(vol: Path) -> None:
    os.symlink(vol.parent / "outside" / "secret.txt", vol / "link.txt")
    assert "outside the volume" in err(read_execute(rw(vol), {"path": "link.txt"}))
    assert "outside the volume" in err(write_execute(rw(vol), {"path": "link.txt", "content": "pwned"}))
    assert (vol.parent / "outside" / "secret.txt").read_text() == "TOP SECRET"


def test_a_directory_symlink_in_the_middle_is_refused(vol: Path) -> None:
    os.symlink(vol.parent / "outside", vol / "dir")
    assert "outside the volume" in err(read_execute(rw(vol), {"path": "dir/secret.txt"}))
    assert "outside the volume" in err(write_execute(rw(vol), {"path": "dir/new.txt", "content": "x"}))
    assert not (vol.parent / "outside" / "new.txt").exists()


def test_a_symlink_that_stays_inside_is_followed(vol: Path) -> None:
    (vol / "real").mkdir()
    (vol / "real" / "f.txt").write_text("inside")
    os.symlink("real", vol / "alias")
    assert ok(read_execute(rw(vol), {"path": "alias/f.txt"})) == "inside"


def test_a_directory_swapped_for_a_symlink_between_check_and_open_is_refused(vol: Path) -> None:
    (vol / "d").mkdir()
    (vol / "d" / "f.txt").write_text("inside")
    loc = fs.locate(vol, "d/f.txt")  # the check passes: d is a real directory now
    (vol / "d").rename(vol / "d-old")
    os.symlink(vol.parent / "outside", vol / "d")  # ... and is a symlink out when the file is opened
    (vol.parent / "outside" / "f.txt").write_text("TOP SECRET")
    with pytest.raises(fs.PathRefused, match="changed under the call"):
        fs.read_bytes(loc, 100)
    with pytest.raises(fs.PathRefused, match="changed under the call"):
        fs.write_atomic(loc, b"pwned")
    assert (vol.parent / "outside" / "f.txt").read_text() == "TOP SECRET"


def test_a_file_swapped_for_a_symlink_between_check_and_open_is_refused(vol: Path) -> None:
    (vol / "f.txt").write_text("inside")
    loc = fs.locate(vol, "f.txt")
    (vol / "f.txt").unlink()
    os.symlink(vol.parent / "outside" / "secret.txt", vol / "f.txt")
    with pytest.raises(fs.PathRefused, match="changed under the call"):
        fs.read_bytes(loc, 100)
    fs.write_atomic(loc, b"new")  # rename replaces the link itself; the target outside is untouched
    assert (vol.parent / "outside" / "secret.txt").read_text() == "TOP SECRET"
    assert not (vol / "f.txt").is_symlink() and (vol / "f.txt").read_text() == "new"


# --- volumes and modes ----------------------------------------------------------------


def test_no_volume_bound_means_no_filesystem() -> None:
    text = err(read_execute(ctx_for(), {"path": "a.txt"}))
    assert "not configured" in text and "no volume bound" in text


def test_a_read_only_binding_refuses_writes_and_edits(vol: Path) -> None:
    (vol / "a.txt").write_text("one")
    assert "read-only" in err(write_execute(ro(vol), {"path": "a.txt", "content": "two"}))
    assert "read-only" in err(edit_execute(ro(vol), {"path": "a.txt", "old_string": "one", "new_string": "two"}))
    assert ok(read_execute(ro(vol), {"path": "a.txt"})) == "one"
    assert (vol / "a.txt").read_text() == "one"


def test_the_volume_is_picked_by_name_then_default_then_sole(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "f").write_text("from a"), (b / "f").write_text("from b")
    two = ctx_for(VolumeBinding("a", str(a), "rw"), VolumeBinding("b", str(b), "rw"))
    assert "name one with `volume`" in err(read_execute(two, {"path": "f"}))
    assert ok(read_execute(two, {"path": "f", "volume": "b"})) == "from b"
    assert "not bound" in err(read_execute(two, {"path": "f", "volume": "c"}))
    with_default = ctx_for(VolumeBinding("a", str(a), "rw"), VolumeBinding("b", str(b), "rw", default=True))
    assert ok(read_execute(with_default, {"path": "f"})) == "from b"


def test_a_missing_volume_directory_names_the_volume_and_path(tmp_path: Path) -> None:
    gone = tmp_path / "not-mounted"
    text = err(read_execute(ctx_for(VolumeBinding("shared", str(gone), "rw")), {"path": "a.txt"}))
    assert "'shared'" in text and str(gone) in text and "does not exist on this worker" in text


# --- Read / Write / Edit ---------------------------------------------------------------


def test_write_is_atomic_creates_directories_and_reports_bytes(vol: Path) -> None:
    assert ok(write_execute(rw(vol), {"path": "a/b/c.txt", "content": "héllo"})) == "wrote 6 bytes to a/b/c.txt"
    assert (vol / "a" / "b" / "c.txt").read_text() == "héllo"
    assert [p.name for p in (vol / "a" / "b").iterdir()] == ["c.txt"]  # no temporary file left


def test_write_over_the_cap_is_refused_and_read_truncates(vol: Path) -> None:
    assert "cap" in err(write_execute(rw(vol), {"path": "big", "content": "x" * (WRITE_CAP + 1)}))
    assert not (vol / "big").exists()
    (vol / "big").write_bytes(b"y" * (READ_CAP + 10))
    text = ok(read_execute(rw(vol), {"path": "big"}))
    assert text == "y" * READ_CAP + f"\n[truncated at {READ_CAP} bytes]"


def test_read_refuses_a_directory_and_a_fifo(vol: Path) -> None:
    (vol / "d").mkdir()
    os.mkfifo(vol / "pipe")
    assert "is a directory" in err(read_execute(rw(vol), {"path": "d"}))
    assert "not a regular file" in err(read_execute(rw(vol), {"path": "pipe"}))
    assert "no such file" in err(read_execute(rw(vol), {"path": "nope.txt"}))


def test_edit_replaces_a_unique_string(vol: Path) -> None:
    (vol / "a.py").write_text("x = 1\ny = 2\n")
    out = ok(edit_execute(rw(vol), {"path": "a.py", "old_string": "y = 2", "new_string": "y = 3"}))
    assert out == "edited a.py (1 replacement)"
    assert (vol / "a.py").read_text() == "x = 1\ny = 3\n"


def test_edit_refuses_ambiguity_absence_and_a_no_op(vol: Path) -> None:
    (vol / "a.py").write_text("v = 1\nv = 1\nv = 1\n")
    text = err(edit_execute(rw(vol), {"path": "a.py", "old_string": "v = 1", "new_string": "v = 2"}))
    assert text.startswith("old_string occurs 3 times in a.py")
    assert "not found" in err(edit_execute(rw(vol), {"path": "a.py", "old_string": "w", "new_string": "z"}))
    assert "the same" in err(edit_execute(rw(vol), {"path": "a.py", "old_string": "v", "new_string": "v"}))
    assert (vol / "a.py").read_text() == "v = 1\nv = 1\nv = 1\n"
    out = ok(edit_execute(rw(vol), {"path": "a.py", "old_string": "v = 1", "new_string": "v = 2", "replace_all": True}))
    assert out == "edited a.py (3 replacements)"
    assert (vol / "a.py").read_text() == "v = 2\nv = 2\nv = 2\n"


def test_edit_refuses_a_file_over_the_cap(vol: Path) -> None:
    (vol / "big").write_bytes(b"a" * (WRITE_CAP + 1))
    assert "Edit works on files up to" in err(
        edit_execute(rw(vol), {"path": "big", "old_string": "a", "new_string": "b"})
    )


def test_edit_refuses_an_oversized_result_before_building_it(vol: Path) -> None:
    """1 MiB of `a`, each replaced by 64 bytes: a 64 MiB result, refused from its computed
    size; nothing near it is ever allocated (a 64 KiB replacement would be 64 GiB)."""
    import tracemalloc

    (vol / "big").write_bytes(b"a" * WRITE_CAP)
    tracemalloc.start()
    try:
        text = err(
            edit_execute(rw(vol), {"path": "big", "old_string": "a", "new_string": "é" * 32, "replace_all": True})
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == f"the edited file would be {WRITE_CAP * 64} bytes; the cap is {WRITE_CAP}"
    assert peak < 8 * WRITE_CAP, peak  # the file and its text, never the 64 MiB result
    assert (vol / "big").read_bytes() == b"a" * WRITE_CAP
    (vol / "fits").write_bytes(b"ab" * 4)
    out = ok(edit_execute(rw(vol), {"path": "fits", "old_string": "a", "new_string": "", "replace_all": True}))
    assert out == "edited fits (4 replacements)" and (vol / "fits").read_bytes() == b"bbbb"


def test_unknown_fields_are_refused(vol: Path) -> None:
    assert "unknown fields ['offset']" in err(read_execute(rw(vol), {"path": "a", "offset": 3}))


# --- Glob ------------------------------------------------------------------------------


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(path.name)
    os.utime(path, (mtime, mtime))


def test_glob_orders_newest_first_and_understands_globstar(vol: Path) -> None:
    _touch(vol / "old.py", 1_000)
    _touch(vol / "pkg" / "mid.py", 2_000)
    _touch(vol / "pkg" / "deep" / "new.py", 3_000)
    _touch(vol / "notes.txt", 4_000)
    assert ok(glob_execute(rw(vol), {"pattern": "**/*.py"})).split("\n") == ["pkg/deep/new.py", "pkg/mid.py", "old.py"]
    assert ok(glob_execute(rw(vol), {"pattern": "*.py"})) == "old.py"
    assert ok(glob_execute(rw(vol), {"pattern": "*.py", "path": "pkg"})) == "pkg/mid.py"
    assert ok(glob_execute(rw(vol), {"pattern": "[mn]*.???"})).split("\n") == ["notes.txt"]
    assert ok(glob_execute(rw(vol), {"pattern": "*.rs"})) == "No files found"


def test_glob_caps_at_100_and_does_not_follow_links_out(vol: Path) -> None:
    for i in range(105):
        _touch(vol / f"f{i:03}.txt", 1_000 + i)
    os.symlink(vol.parent / "outside", vol / "out")
    lines = ok(glob_execute(rw(vol), {"pattern": "**/*.txt"})).split("\n")
    assert lines[0] == "f104.txt" and len(lines) == 101
    assert lines[-1] == "[5 more files not shown; narrow the pattern]"
    assert not any("secret" in line for line in lines)


# --- Grep ------------------------------------------------------------------------------


@pytest.fixture
def tree(vol: Path) -> Path:
    (vol / "src").mkdir()
    (vol / "src" / "a.py").write_text("import os\ndef alpha():\n    return 1\n")
    (vol / "src" / "b.py").write_text("def beta():\n    return 2\ndef Alpha_two():\n    pass\n")
    (vol / "README.md").write_text("alpha and beta\n")
    (vol / "blob.bin").write_bytes(b"alpha\x00\x01")
    return vol


def grep(root: Path, **data: Any) -> str:
    return ok(grep_execute(rw(root), data))


def test_grep_files_with_matches_is_the_default(tree: Path) -> None:
    assert grep(tree, pattern="alpha").split("\n") == ["README.md", "src/a.py", "[1 binary file(s) skipped]"]


def test_grep_content_mode_with_line_numbers_and_context(tree: Path) -> None:
    assert (
        grep(tree, pattern="^def", output_mode="content", path="src/b.py")
        == "src/b.py:1:def beta():\nsrc/b.py:3:def Alpha_two():"
    )
    text = grep(tree, pattern="return 1", output_mode="content", glob="*.py", **{"-B": 1})
    assert text == "src/a.py-2-def alpha():\nsrc/a.py:3:    return 1"


def test_grep_count_case_insensitive_glob_and_head_limit(tree: Path) -> None:
    assert (
        grep(tree, pattern="alpha", output_mode="count", case_insensitive=True, glob="*.py") == "src/a.py:1\nsrc/b.py:1"
    )
    assert grep(tree, pattern="def", output_mode="content", head_limit=2, glob="*.py").count("\n") == 1


def test_grep_multiline_matches_across_lines(tree: Path) -> None:
    text = grep(tree, pattern=r"alpha\(\):\n\s+return", multiline=True, output_mode="content", glob="*.py")
    assert text == "src/a.py:2:def alpha():\nsrc/a.py:3:    return 1"
    assert grep(tree, pattern=r"alpha\(\):\n\s+return") == "No matches found\n[1 binary file(s) skipped]"


def test_grep_refuses_a_bad_pattern_and_a_glob_with_a_slash(tree: Path) -> None:
    assert "invalid pattern" in err(grep_execute(rw(tree), {"pattern": "(unclosed"}))
    assert "single path segment" in err(grep_execute(rw(tree), {"pattern": "a", "glob": "src/*.py"}))


def test_a_catastrophic_pattern_times_out(vol: Path) -> None:
    (vol / "evil.txt").write_text("a" * 60 + "!\n")
    result = grep_execute(rw(vol), {"pattern": r"^(a|aa)+$"})
    assert "took longer than" in err(result) and f"{GREP_TIMEOUT_S:g} s" in result.text


def test_context_self_reports_the_bindings_without_host_paths(tmp_path: Path) -> None:
    ctx = ctx_for(VolumeBinding("work", str(tmp_path), "ro"), VolumeBinding("scratch", "", "rw", True, True))
    seen = json.loads(ok(context_execute(ctx, {"op": "self"})))
    assert seen["volumes"] == [
        {"name": "work", "mode": "ro", "default": False, "ephemeral": False},
        {"name": "scratch", "mode": "rw", "default": True, "ephemeral": True},
    ]
    assert str(tmp_path) not in json.dumps(seen)


def test_glob_does_not_backtrack_on_a_pathological_pattern(vol: Path) -> None:
    _touch(vol / ("a" * 60), 1_000)
    started = time.monotonic()
    assert ok(glob_execute(rw(vol), {"pattern": "*a" * 8 + "b"})) == "No files found"
    assert ok(glob_execute(rw(vol), {"pattern": "**/" + "*a" * 8})) == "a" * 60
    assert time.monotonic() - started < 1


def test_glob_refuses_a_bad_character_class(vol: Path) -> None:
    assert "invalid pattern" in err(glob_execute(rw(vol), {"pattern": "[z-a]*"}))


def test_glob_stops_at_its_deadline_and_on_cancel(vol: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        _touch(vol / f"d{i}" / "f.txt", 1_000)
    monkeypatch.setattr(files, "GLOB_TIMEOUT_S", 0.0)
    assert "took longer than 0 s" in err(glob_execute(rw(vol), {"pattern": "**/*.txt"}))
    monkeypatch.setattr(files, "GLOB_TIMEOUT_S", 5.0)
    ctx = rw(vol)
    ctx.cancelled.set()
    assert "cancelled" in err(glob_execute(ctx, {"pattern": "**/*.txt"}))


def test_glob_stops_scanning_at_the_cap(vol: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        _touch(vol / f"f{i}.txt", 1_000 + i)
    monkeypatch.setattr(files, "GLOB_MAX_SCANNED", 3)
    lines = ok(glob_execute(rw(vol), {"pattern": "*.txt"})).split("\n")
    assert len(lines) == 4 and lines[-1] == "[stopped after scanning 3 files; narrow path]"


def test_glob_lists_nothing_through_a_directory_swapped_for_a_symlink(vol: Path) -> None:
    _touch(vol / "d" / "mine.txt", 1_000)
    os.symlink(vol.parent / "outside", vol / "link")
    assert ok(glob_execute(rw(vol), {"pattern": "**/*.txt"})) == "d/mine.txt"


def test_grep_context_is_clamped_and_merged_and_stops_at_head_limit(vol: Path) -> None:
    (vol / "many.txt").write_text("x\n" * 5_000)
    text = grep(vol, pattern="x", output_mode="content", head_limit=250, **{"-C": 10_000})
    lines = text.split("\n")
    assert len(lines) == 250 and lines[0] == "many.txt:1:x" and lines[-1] == "many.txt:250:x"
    text = grep(vol, pattern="^$", output_mode="content", **{"-B": 10_000})
    assert text.split("\n")[0] == "many.txt-4901-x"  # -B clamped to 100 before the empty last line


def test_grep_context_step_is_inside_the_deadline(vol: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (vol / "many.txt").write_text("x\n" * 50)
    monkeypatch.setattr(grep_module, "MAX_CONTEXT", 10**9)
    slow_calls = []

    def slow_left(q: Any) -> float:
        slow_calls.append(1)
        if len(slow_calls) > 60:
            q.budget.deadline = 0.0
        return q.budget.left()

    monkeypatch.setattr(grep_module, "_left", slow_left)
    result = grep_execute(rw(vol), {"pattern": "x", "output_mode": "content", "head_limit": 10**6, "-C": 10**6})
    assert "took longer than" in err(result)


def test_grep_line_numbers_can_be_turned_off(tree: Path) -> None:
    assert grep(tree, pattern="^def", output_mode="content", path="src/b.py", **{"-n": False}) == (
        "src/b.py:def beta():\nsrc/b.py:def Alpha_two():"
    )
    assert "-n must be a boolean" in err(grep_execute(rw(tree), {"pattern": "a", "-n": "yes"}))


def test_grep_walk_honours_the_cancel(tree: Path) -> None:
    ctx = rw(tree)
    ctx.cancelled.set()
    assert "cancelled" in err(grep_execute(ctx, {"pattern": "alpha"}))


def test_parallel_writes_into_a_new_directory_all_succeed(vol: Path) -> None:
    results: list[ToolResult] = []
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        barrier.wait()
        results.append(write_execute(rw(vol), {"path": f"new/deep/f{i}.txt", "content": str(i)}))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.is_error for r in results] == [False] * 8
    assert sorted(p.name for p in (vol / "new" / "deep").iterdir()) == [f"f{i}.txt" for i in range(8)]


def test_a_mkdir_race_is_not_a_failure(vol: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_mkdir = os.mkdir

    def racing_mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)  # "another call" made it just now
        raise FileExistsError(17, "File exists", path)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    ok(write_execute(rw(vol), {"path": "made/by/someone/x.txt", "content": "x"}))
    assert (vol / "made" / "by" / "someone" / "x.txt").read_text() == "x"


def test_parallel_edits_of_one_file_keep_every_edit(vol: Path) -> None:
    (vol / "f.txt").write_text("".join(f"line{i}\n" for i in range(16)))
    barrier = threading.Barrier(16)
    results: list[ToolResult] = []

    def edit(i: int) -> None:
        barrier.wait()
        results.append(edit_execute(rw(vol), {"path": "f.txt", "old_string": f"line{i}\n", "new_string": f"EDIT{i}\n"}))

    threads = [threading.Thread(target=edit, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.is_error for r in results] == [False] * 16
    assert (vol / "f.txt").read_text() == "".join(f"EDIT{i}\n" for i in range(16))


def test_write_handles_a_255_byte_name_and_keeps_permissions_exactly(vol: Path) -> None:
    long = "n" * 255
    ok(write_execute(rw(vol), {"path": long, "content": "x"}))
    assert (vol / long).read_text() == "x"
    (vol / "g.sh").write_text("old")
    os.chmod(vol / "g.sh", 0o775)
    old_umask = os.umask(0o077)
    try:
        ok(write_execute(rw(vol), {"path": "g.sh", "content": "new"}))
    finally:
        os.umask(old_umask)
    assert (vol / "g.sh").stat().st_mode & 0o777 == 0o775


def test_an_os_error_names_the_given_path_never_the_host_path(vol: Path) -> None:
    name = "x" * 300  # ENAMETOOLONG
    text = err(write_execute(rw(vol), {"path": f"sub/{name}", "content": "x"}))
    assert text == f"file name too long: sub/{name}" and str(vol) not in text
    text = err(read_execute(rw(vol), {"path": name}))
    assert str(vol) not in text and text.endswith(name)
