"""Who calls: the `authorization: Bearer …` metadata through the HTTP surface's own
authentication (apps.substrate.auth.aauthenticate_for: the same tokens, open mode on loopback
only, the same 401/403/503), and the scope each RPC needs taken from the HTTP route it
mirrors (apps.substrate.auth.required_scope), so the two transports cannot disagree."""

from __future__ import annotations

import grpc

from apps.core.types import Principal
from apps.substrate.auth import aauthenticate_for, bearer_from_headers


def metadata_headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata, lower-cased keys (binary `-bin` entries skipped)."""
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            out.setdefault(key.lower(), value)
    return out


def peer_host(peer: str | None) -> str | None:
    """`ipv4:127.0.0.1:5000` / `ipv6:[::1]:5000` -> the address; anything else (unix:) -> None,
    which open mode treats as not loopback."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


async def principal_for(context: grpc.aio.ServicerContext, method: str, path: str) -> Principal:
    """The caller as the HTTP route `method path` would see it; raises its ApplicationError."""
    token = bearer_from_headers({"authorization": metadata_headers(context).get("authorization", "")})
    return await aauthenticate_for(token, peer_host(context.peer()), method, path)
