"""An MCPServerDef row made into a `ServerSpec`: what a session needs to connect.

- `${NAME}` references in headers/env are resolved by substrate's
  `mcp_server_connection` (its rules on who may reference what);
- `${run.user_bearer}` / `${run.credentials.<name>}` in header values are filled
  from the calling run's credentials here, at call time only (apps.tools.httpcall's
  templates: absent without a fallback refuses the call); discovery has no run,
  so a header whose template cannot be filled is left out of discovery's requests;
- an HTTP server's URL is checked against the SSRF guard before every connect
  (`check_reachable`), and the transport checks every connection it dials again.
  A runtime-authored server must be within LOOMCYCLE_HTTP_HOST_ALLOWLIST (when set);
  an operator's yaml server need not, but no server may reach a non-public address
  unless its host is in LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST;
- a runtime-authored HTTP server is held to the network tools' operator floor: while
  the network is not configured (apps.core.hosts.network_configured) it is refused,
  for discovery and calls alike; at call time it must also be within the calling
  run's `allowed_hosts` (`run_host_refusal`), as HTTP and WebFetch are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings

from apps.core import egress, hosts
from apps.core.egress import EgressRefused, HostPolicy
from apps.core.tools import ToolRefusal
from apps.substrate.kinds import Refused
from apps.substrate.kinds.mcp import mcp_server_connection
from apps.substrate.models import DefSource, VersionedDef
from apps.tools.httpcall import substitute

STDIO = "stdio"
NOT_CONFIGURED = (
    "mcp server {name!r}: a runtime-defined HTTP MCP server is not reachable while the network is not "
    "configured: set LOOMCYCLE_HTTP_HOST_ALLOWLIST (hosts this runtime may reach, `*` for any public host), "
    "or LOOMCYCLE_HTTP_CALLER_AUTHORITATIVE=1 to let each run's allowed_hosts decide"
)


@dataclass(frozen=True)
class ServerSpec:
    """One server as a session connects to it. `key` names the session it may share:
    the def version, plus (HTTP) a digest of the headers as sent, so runs with
    different credentials never share a session. Never logged or persisted."""

    def_id: str
    tenant_id: str
    name: str
    transport: str
    url: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    policy: HostPolicy | None = None
    max_response_bytes: int = 4 * 1024 * 1024  # server_spec sets LOOMCYCLE_MCP_MAX_RESPONSE_BYTES

    @property
    def is_stdio(self) -> bool:
        return self.transport == STDIO

    @property
    def key(self) -> str:
        if self.is_stdio:
            return self.def_id
        digest = hashlib.sha256(json.dumps(sorted(self.headers.items())).encode()).hexdigest()[:16]
        return f"{self.def_id}:{digest}"


def server_policy(row: VersionedDef) -> HostPolicy:
    """Where an HTTP server of this row may be reached (see the module docstring)."""
    allowlist = tuple(settings.LOOMCYCLE.http_host_allowlist)
    allowed = None if row.source == DefSource.YAML or not allowlist else allowlist
    return egress.operator_policy(allowed)


def server_spec(row: VersionedDef, *, credentials: Mapping[str, str] | None) -> ServerSpec:
    """The spec for a call (`credentials`: the run's) or for discovery (None).
    Raises substrate's Refused (a reference it may not resolve) or ToolRefusal
    (a run template it cannot fill)."""
    conn = mcp_server_connection(row)
    if conn.transport != STDIO and row.source != DefSource.YAML and not hosts.network_configured():
        raise Refused(NOT_CONFIGURED.format(name=row.name))
    base = ServerSpec(def_id=row.id, tenant_id=row.tenant_id, name=row.name, transport=conn.transport)
    if conn.transport == STDIO:
        return replace(base, command=conn.command, args=conn.args, env=dict(conn.env))
    headers = _headers(conn.headers, credentials)
    limit = settings.LOOMCYCLE.mcp_max_response_bytes
    return replace(base, url=conn.url, headers=headers, policy=server_policy(row), max_response_bytes=limit)


def run_host_refusal(row: VersionedDef, allowed_hosts: Sequence[str]) -> str | None:
    """Why a run whose effective host list is `allowed_hosts` may not call the runtime-authored
    HTTP server of `row` (None: it may). A yaml server (the operator's) and stdio are not held to it."""
    d = row.definition
    if row.source == DefSource.YAML or d.get("transport") == STDIO:
        return None
    host = urlsplit(str(d.get("url", ""))).hostname or ""
    if hosts.host_matches(host, allowed_hosts):
        return None
    return f"mcp server {row.name!r}: host {host!r} is not within this run's allowed_hosts"


def _headers(templates: Mapping[str, str], credentials: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for name, template in templates.items():
        try:
            out[name], _ = substitute(template, credentials or {})
        except ToolRefusal:
            if credentials is not None:
                raise
            # discovery: no run, so no credential; the header is not sent
    return out


def check_reachable(spec: ServerSpec) -> None:
    """The guard's verdict on an HTTP server's URL before connecting: the host list,
    then every address the name resolves to. Raises EgressRefused with the reason."""
    if spec.is_stdio or spec.policy is None:
        return
    url = httpx.URL(spec.url)
    egress.check_url(url, spec.policy)
    parts = urlsplit(spec.url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = egress.system_resolver(host, port)
    except httpcore.ConnectError as exc:  # the name does not resolve
        raise EgressRefused(f"cannot resolve {host!r}: {exc}") from exc
    egress.check_addresses(host, addresses, spec.policy)
