"""The dependency rules of docs/architecture.md hold (pyproject's
[tool.importlinter] contracts, also run by `make lint`), so CI fails the
commit that makes apps/core import another app or the engine import a tool's app;
and apps/runs/store/ stays the one package that writes run state."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


# --- One owner of run state (issue 18): apps/runs/store/ is the only package that writes `runs_*` tables.

RUN_MODELS = frozenset(
    {"Run", "RunEvent", "TranscriptEntry", "RunInput", "ToolCallRecord", "RuntimeState", "SignalOutbox", "Interrupt"}
    | {"FanOut", "FanOutSlot", "ResidentChild", "RunWebhook", "RunWebhookDelivery"}
)
WRITE_METHODS = frozenset(
    {"create", "bulk_create", "get_or_create", "update_or_create", "update", "bulk_update", "delete"}
)
RUN_TABLE = (
    r"runs_(?:run|runevent|transcriptentry|runinput|toolcallrecord|runtimestate|signaloutbox|interrupt"
    r"|fanout|fanoutslot|residentchild|runwebhook|runwebhookdelivery)\b"
)
SQL_WRITE = re.compile(rf"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+{RUN_TABLE}", re.I)
SQL_ANY = re.compile(rf"\b{RUN_TABLE}")
OWNER = "apps/runs/store/"


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string literal, f-strings' literal parts included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _run_manager(node: ast.expr, models: frozenset[str] = RUN_MODELS) -> str | None:
    """The run model (or one of `models`) whose `.objects` a chained call starts from
    (`Run.objects.filter(...)...`), if any."""
    while True:
        if isinstance(node, ast.Attribute):
            if node.attr == "objects" and isinstance(node.value, ast.Name) and node.value.id in models:
                return node.value.id
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return None


def run_state_violations(source: str, *, inside_runs: bool) -> list[str]:
    """What in `source` writes run state (or, outside apps/runs, touches run tables at all)."""
    tree = ast.parse(source)
    found = [f"{n}: SQL writes a runs_ table" for n, s in _strings(tree) if SQL_WRITE.search(s)]
    if not inside_runs:
        found += [
            f"{n}: SQL names a runs_ table (ask apps.runs.selectors)" for n, s in _strings(tree) if SQL_ANY.search(s)
        ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or (model := _run_manager(node.value)) is None:
            continue
        if node.attr in WRITE_METHODS:
            found.append(f"{node.lineno}: {model}.objects ... .{node.attr}(")
        elif not inside_runs and isinstance(node.value, ast.Attribute) and node.value.attr == "objects":
            found.append(f"{node.lineno}: {model}.objects queried outside apps.runs (use apps.runs.selectors)")
    return found


def _modules() -> Iterator[Path]:
    for top in ("apps", "workers", "loomcycle_project"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" not in path.relative_to(ROOT).parts:
                yield path


def test_only_the_store_writes_run_state() -> None:
    offences = []
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(OWNER):
            continue
        found = run_state_violations(path.read_text(), inside_runs=name.startswith("apps/runs/"))
        offences += [f"{name}:{line}" for line in found]
    assert offences == []


def test_the_run_state_check_sees_each_kind_of_write() -> None:
    source = """
RunEvent.objects.create(run_id=r, seq=1)
Run.objects.filter(id=r).exclude(status="x").update(step=F("step") + 1)
RuntimeState.objects.select_for_update().get_or_create(id=1)
RunInput.objects.filter(run_id=r)[:5].delete()
cur.execute(f"UPDATE runs_run SET status = {s} WHERE id = %s", [r])
cur.execute("insert into runs_runevent (run_id) values (%s)", [r])
"""
    lines = [v.split(":")[0] for v in run_state_violations(source, inside_runs=True)]
    assert sorted(lines, key=int) == ["2", "3", "4", "5", "6", "7"]
    outside = run_state_violations(
        'Run.objects.filter(id=r).first()\ncur.execute("SELECT 1 FROM w JOIN runs_run r ON true")', inside_runs=False
    )
    assert sorted(v.split(":")[0] for v in outside) == ["1", "2"]
    assert (
        run_state_violations('Run.objects.filter(id=r).first()\n"maintenance.runs_admission_sweep"', inside_runs=True)
        == []
    )


# --- One owner of channel declarations (issue 34): ChannelDef rows are substrate's, written only
# by apps/substrate (channeldefs.py for the runtime ones, config.py for yaml); apps/channels reads.

CHANNEL_DEF_SQL = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+substrate_channeldef\b", re.I
)


def channel_def_writes(source: str) -> list[str]:
    """What in `source` writes ChannelDef rows: a manager write, a bulk insert handed the model, SQL."""
    tree = ast.parse(source)
    found = [f"{n}: SQL writes substrate_channeldef" for n, s in _strings(tree) if CHANNEL_DEF_SQL.search(s)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WRITE_METHODS:
            if _run_manager(node.value, frozenset({"ChannelDef"})) is not None:
                found.append(f"{node.lineno}: ChannelDef.objects ... .{node.attr}(")
        elif isinstance(node, ast.Call) and "insert" in ast.unparse(node.func):
            if any(isinstance(a, ast.Name) and a.id == "ChannelDef" for a in node.args):
                found.append(f"{node.lineno}: ChannelDef rows inserted")
    return found


def test_only_substrate_writes_channel_declarations() -> None:
    offences = []
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith("apps/substrate/"):
            offences += [f"{name}:{line}" for line in channel_def_writes(path.read_text())]
    assert offences == []


def test_the_channel_declaration_check_sees_each_kind_of_write() -> None:
    source = """
ChannelDef.objects.create(tenant_id="", name="x")
ChannelDef.objects.filter(name="x").delete()
rows_insert_or_ignore(ChannelDef, rows)
cur.execute("DELETE FROM substrate_channeldef WHERE name = %s", [n])
ChannelDef.objects.filter(name="x").first()
"""
    assert sorted(v.split(":")[0] for v in channel_def_writes(source)) == ["2", "3", "4", "5"]


# --- Shared shapes have one home (issue 34): test modules share set-up through tests/factories/
# and conftest fixtures, never by importing each other; bench scripts start through bench/stack.


TEST_MODULE_IMPORT = re.compile(
    r"^\s*(?:from\s+tests(?:\.\w+)*\.test_\w+\s+import|import\s+tests(?:\.\w+)*\.test_\w+)", re.M
)


def test_no_test_module_imports_another() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{source[: m.start()].count(chr(10)) + 1}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for source in [path.read_text()]
        for m in TEST_MODULE_IMPORT.finditer(source)
    ]
    assert offences == []


def test_bench_scripts_start_through_bench_stack() -> None:
    """Django is set up (after the environment and the embedded services) in bench/stack.boot only."""
    scripts = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "stack.py")
    assert [p.name for p in scripts if "django.setup()" in p.read_text()] == []
