"""`agents`, `agent show|apply`, `memory get|set|search`, `channel publish|tail`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from loomcycle_http.cli import output
from loomcycle_http.cli.context import Ctx, pass_ctx


@click.command()
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def agents(ctx: Ctx, as_json: bool) -> None:
    """The agents this token sees: name, versions, whether a yaml entry defines it."""
    rows = ctx.client.agents.list()
    if as_json:
        for row in rows:
            output.print_json(row)
        return
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "VERSIONS", "LATEST", "STATIC", "UPDATED"):
        table.add_column(column)
    for row in rows:
        cells = (row["name"], str(row.get("version_count", 0)), str(row.get("latest_version") or "-"))
        table.add_row(*cells, "yes" if row.get("static") else "", str(row.get("last_updated") or ""))
    Console(highlight=False, width=200).print(table)


@click.group()
def agent() -> None:
    """One agent definition."""


@agent.command("show")
@click.argument("name")
@pass_ctx
def agent_show(ctx: Ctx, name: str) -> None:
    """The active version of NAME (YAML)."""
    row = ctx.client.agents.get(name)
    shown = {k: row.get(k) for k in ("name", "def_id", "version", "content_sha256", "source", "definition")}
    sys.stdout.write(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True))


def load_definition(path: Path) -> tuple[str, dict[str, Any]]:
    """(name, definition) of a FILE.yaml (the fields, or one `agents:` entry) or a FILE.md
    (YAML front matter, the body as system_prompt). The name defaults to the file's stem."""
    text = path.read_text()
    if path.suffix == ".md":
        head, body = _front_matter(text, path)
        found = {**head, "system_prompt": body.strip()} if body.strip() else head
    else:
        found = _yaml(text, str(path))
    if not isinstance(found, dict):
        raise click.BadParameter(f"{path}: expected a mapping of agent fields")
    if isinstance(found.get("agents"), dict) and len(found["agents"]) == 1:
        ((name, fields),) = found["agents"].items()
        if not isinstance(fields, dict):
            raise click.BadParameter(f"{path}: agents.{name} must be a mapping of agent fields")
        return str(name), dict(fields)
    return str(found.pop("name", path.stem)), found


def _front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    if not text.startswith("---"):
        return {}, text
    _, head, body = text.split("---", 2) if text.count("---") >= 2 else ("", "", text)
    found = _yaml(head, f"{path}: the front matter")
    if not isinstance(found, dict):
        raise click.BadParameter(f"{path}: the front matter must be a mapping of agent fields")
    return found, body


def _yaml(text: str, where: str) -> Any:
    """`text` parsed (None → {}); malformed YAML is a usage error naming `where` and the problem."""
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{where} is not valid YAML: {exc}") from exc


@agent.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="the agent's name (default: the file's `name`, else its stem)")
@click.option("--description", default="", help="a note for this version")
@pass_ctx
def agent_apply(ctx: Ctx, file: Path, name: str | None, description: str) -> None:
    """Create (or fork) an agent from FILE.yaml or FILE.md; prints its version and content hash."""
    found_name, definition = load_definition(file)
    found_name = name or found_name
    description = description or str(definition.pop("description", "") or "")
    row = ctx.client.agents.apply(found_name, definition, description=description)
    same = " (unchanged)" if row.get("deduplicated") else ""
    output.write_out(f"{row['name']} v{row['version']} {row['def_id']} {row['content_sha256']}{same}")


def parse_value(text: str) -> Any:
    """JSON when it parses, else the text as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@click.group()
def memory() -> None:
    """Memory rows: SCOPE is agent, user, tenant or global (SCOPE_ID `-` for the last two)."""


@memory.command("get")
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@pass_ctx
def memory_get(ctx: Ctx, scope: str, scope_id: str, key: str) -> None:
    """Print a key's value (JSON)."""
    output.print_json(ctx.client.memory.get(scope, scope_id, key))


@memory.command("set")
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.argument("value")
@click.option("--ttl", type=int, help="seconds until it expires")
@click.option("--embed", is_flag=True, help="embed it for memory search")
@pass_ctx
def memory_set(ctx: Ctx, scope: str, scope_id: str, key: str, value: str, ttl: int | None, embed: bool) -> None:
    """Set KEY to VALUE (JSON if it parses, else a string; `-` reads stdin)."""
    raw = sys.stdin.read() if value == "-" else value
    answer = ctx.client.memory.set(scope, scope_id, key, parse_value(raw), ttl_seconds=ttl, embed=embed)
    output.note(
        f"set {scope}/{scope_id}/{key}" + (f" ({answer['embed_warning']})" if answer.get("embed_warning") else "")
    )


@memory.command("search")
@click.argument("query")
@click.option("--scope", required=True)
@click.option("--scope-id", default="")
@click.option("--top-k", type=int, default=5)
@pass_ctx
def memory_search(ctx: Ctx, query: str, scope: str, scope_id: str, top_k: int) -> None:
    """Semantic search over embedded rows (JSON)."""
    output.print_json(ctx.client.memory.search(query, scope=scope, scope_id=scope_id, top_k=top_k))


@click.group()
def channel() -> None:
    """Channels of the caller's tenant."""


@channel.command("publish")
@click.argument("name")
@click.argument("payload", default="-")
@click.option("--ttl", type=int, help="seconds the message lives (default: the channel's)")
@pass_ctx
def channel_publish(ctx: Ctx, name: str, payload: str, ttl: int | None) -> None:
    """Publish PAYLOAD (JSON if it parses, else a string; `-` or absent reads stdin); prints the message id."""
    raw = sys.stdin.read() if payload == "-" else payload
    output.write_out(str(ctx.client.channels.publish(name, parse_value(raw), ttl=ttl)["msg_id"]))


@channel.command("tail")
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="keep waiting for new messages")
@click.option("--from-cursor", default="cur_0", help="start after this cursor (default: the oldest)")
@pass_ctx
def channel_tail(ctx: Ctx, name: str, follow: bool, from_cursor: str) -> None:
    """Print the channel's messages as JSON lines (never commits a cursor)."""
    if follow:
        for message in ctx.client.channels.tail(name, from_cursor=from_cursor):
            output.print_json(message)
        return
    while True:
        page = ctx.client.channels.wait(name, from_cursor=from_cursor, wait_ms=0)
        for message in page["messages"]:
            output.print_json(message)
        if not page["messages"]:
            return
        from_cursor = page["next_cursor"]
