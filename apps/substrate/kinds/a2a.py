"""A2AServerCardDef and A2AAgentDef (SPEC 5.2, loomcycle's `a2a_server_cards:` and
`a2a_agents:` field sets): validation and the content hash only. The server that serves
cards and tasks from a server card, and the client tool that calls a peer, live in apps.a2a.

loomcycle hashes neither kind; this runtime does (`a2a_content_sha256`, pinned by
tests/a2a/test_defs.py), so `verify` works for them as for MCPServerDef. What loomcycle
declares but this runtime does not do is refused, never stored and ignored: a card signed
with `sign_with_key_env`, a peer whose card must be signed (`verify_signed_card`), and any
binding but JSON-RPC.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from apps.substrate import hashing
from apps.substrate.kinds.base import Kind, Refused, drop_unknown, string_list
from apps.substrate.kinds.fields import get_flag, get_object, get_text, put
from apps.substrate.kinds.mcp import check_peer_url
from apps.substrate.models import A2AAgentDef, A2AAgentDefActive, A2AServerCardDef, A2AServerCardDefActive

CARD_FIELDS = frozenset(
    {"name", "description", "provider", "capabilities", "exposed_agents", "security_schemes", "sign_with_key_env"}
)
_EXPOSED_FIELDS = frozenset(
    {"agent_name", "skill_id", "skill_name", "description", "tags", "input_modes", "output_modes"}
)
_CAPABILITIES = ("streaming", "push_notifications", "extended_agent_card")
SCHEME_KINDS = ("http", "apiKey", "oauth2", "mtls")
PEER_FIELDS = frozenset(
    {"agent_card_url", "endpoint", "binding", "auth", "expected_skills", "verify_signed_card", "description"}
)
BINDINGS = ("jsonrpc",)
_SKILL_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
A2A_OPS = frozenset({"create", "fork", "get", "list", "retire", "promote", "verify"})


def _objects(value: Any, what: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise Refused(f"{what} must be a list of objects")
    return list(value)


def _skill_id(value: str, what: str) -> str:
    if not _SKILL_ID_RE.fullmatch(value):
        raise Refused(f"{what}: skill id {value!r} must match [A-Za-z0-9_.-]{{1,128}}")
    return value


def _exposed(raw: dict[str, Any], what: str, strict: bool) -> dict[str, Any]:
    d = drop_unknown(what, "exposed agent", raw, _EXPOSED_FIELDS, strict)
    agent = get_text(d, "agent_name", f"{what}: exposed_agents", required=True)
    out: dict[str, Any] = {"agent_name": agent, "skill_id": _skill_id(get_text(d, "skill_id", what) or agent, what)}
    for key in ("skill_name", "description"):
        put(out, key, get_text(d, key, f"{what}: exposed_agents"))
    for key in ("tags", "input_modes", "output_modes"):
        put(out, key, string_list(d.get(key), f"{what}: exposed_agents.{key}") or None)
    return out


def _capabilities(d: dict[str, Any], what: str) -> dict[str, bool]:
    caps = get_object(d, "capabilities", what) or {}
    unknown = set(caps) - set(_CAPABILITIES)
    if unknown:
        raise Refused(f"{what}: capabilities takes {', '.join(_CAPABILITIES)} (unknown: {', '.join(sorted(unknown))})")
    return {key: get_flag(caps, key, f"{what}: capabilities", key == "streaming") for key in _CAPABILITIES}


def _schemes(value: Any, what: str) -> list[dict[str, str]]:
    out = []
    for scheme in _objects(value, f"{what}: security_schemes"):
        kind = scheme.get("kind")
        if kind not in SCHEME_KINDS or set(scheme) - {"kind", "scheme"}:
            raise Refused(f"{what}: a security scheme is {{kind: {'|'.join(SCHEME_KINDS)}, scheme}} (got {scheme!r})")
        out.append({"kind": kind, "scheme": get_text(scheme, "scheme", what)})
    return out


def normalise_card(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"a2a server card {name!r}"
    raw = dict(raw)
    raw.pop("name", None)  # stamped from the def's name (the card is addressed by it)
    d = drop_unknown(name, "a2a server card", raw, CARD_FIELDS, strict)
    if d.get("sign_with_key_env"):
        raise Refused(f"{what}: sign_with_key_env: this runtime does not sign agent cards (docs/compat.md)")
    exposed = [_exposed(e, what, strict) for e in _objects(d.get("exposed_agents"), f"{what}: exposed_agents")]
    if not exposed:
        raise Refused(f"{what}: exposed_agents must name at least one agent")
    skill_ids = [e["skill_id"] for e in exposed]
    if len(set(skill_ids)) != len(skill_ids):
        raise Refused(f"{what}: exposed_agents: each skill_id must be unique (got {skill_ids})")
    out: dict[str, Any] = {"name": name}
    put(out, "description", get_text(d, "description", what))
    provider = get_object(d, "provider", what)
    if provider is not None:
        if set(provider) - {"organization", "url"}:
            raise Refused(f"{what}: provider takes organization and url")
        out["provider"] = {k: get_text(provider, k, f"{what}: provider") for k in ("organization", "url")}
    out["capabilities"] = _capabilities(d, what)
    out["exposed_agents"] = exposed
    put(out, "security_schemes", _schemes(d.get("security_schemes"), what) or None)
    return out


def _check_peer_name(name: str, what: str) -> None:
    """A peer's tools are named `a2a__<peer>__<skill>`: a `__`, `/` or edge `_` in the name
    could fall inside another peer's tool glob (as MCP server names, kinds.mcp)."""
    if "/" in name or "__" in name or name.startswith("_") or name.endswith("_"):
        raise Refused(f"{what}: a peer name is one segment without '__' and not starting or ending with '_'")


def _auth(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"scheme", "bearer_credential_ref"}:
        raise Refused(f"{what}: auth is {{scheme, bearer_credential_ref}}")
    scheme = get_text(value, "scheme", f"{what}: auth") or "http"
    if scheme != "http":
        raise Refused(f"{what}: auth.scheme: this runtime calls peers with http bearer auth only (got {scheme!r})")
    ref = get_text(value, "bearer_credential_ref", f"{what}: auth", required=True)
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", ref):
        raise Refused(f"{what}: auth.bearer_credential_ref must name a run credential ([a-zA-Z0-9_-]{{1,64}})")
    return {"scheme": scheme, "bearer_credential_ref": ref}


def normalise_peer(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"a2a agent {name!r}"
    _check_peer_name(name, what)
    raw = dict(raw)
    raw.pop("name", None)
    d = drop_unknown(name, "a2a agent", raw, PEER_FIELDS, strict)
    if get_flag(d, "verify_signed_card", what, False):
        raise Refused(f"{what}: verify_signed_card: this runtime does not verify signed agent cards (docs/compat.md)")
    card_url, endpoint = get_text(d, "agent_card_url", what), get_text(d, "endpoint", what)
    if bool(card_url) == bool(endpoint):
        raise Refused(f"{what}: give exactly one of agent_card_url and endpoint")
    out: dict[str, Any] = {}
    put(out, "agent_card_url", card_url and check_peer_url(card_url, what, strict))
    put(out, "endpoint", endpoint and check_peer_url(endpoint, what, strict))
    binding = get_text(d, "binding", what) or "jsonrpc"
    if binding not in BINDINGS:
        raise Refused(f"{what}: binding must be jsonrpc (got {binding!r})")
    out["binding"] = binding
    put(out, "auth", _auth(d.get("auth"), what) or None)
    skills = []
    for skill in _objects(d.get("expected_skills"), f"{what}: expected_skills"):
        if set(skill) - {"id", "required"}:
            raise Refused(f"{what}: an expected skill is {{id, required}}")
        sid = _skill_id(get_text(skill, "id", f"{what}: expected_skills", required=True), what)
        skills.append({"id": sid, "required": get_flag(skill, "required", what, False)})
    put(out, "expected_skills", skills or None)
    put(out, "description", get_text(d, "description", what))
    return out


def a2a_content_sha256(name: str, definition: dict[str, Any]) -> str:
    """ "sha256:" + hex of the name and normalised definition as Go's encoding/json writes a map
    (sorted keys, compact): loomcycle publishes no hash for these kinds, so this recipe is ours."""
    text = hashing.go_json({**definition, "name": name})
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


A2A_SERVER_CARD = Kind(
    key="a2aservercard",
    tool="A2AServerCardDef",
    model=A2AServerCardDef,
    pointer=A2AServerCardDefActive,
    ops=A2A_OPS,
    normalise=normalise_card,
    content_hash=a2a_content_sha256,
    fork_promotes=True,
    yaml_key="a2a_server_cards",
)

A2A_AGENT = Kind(
    key="a2aagent",
    tool="A2AAgentDef",
    model=A2AAgentDef,
    pointer=A2AAgentDefActive,
    ops=A2A_OPS,
    normalise=normalise_peer,
    content_hash=a2a_content_sha256,
    fork_promotes=True,
    yaml_key="a2a_agents",
)
