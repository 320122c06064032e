"""Host lists (SPEC 6.1, 8): matching, validation, intersection, and a new
run's effective list. The SSRF guard (apps.core.egress) enforces them.

Matching is a suffix match at a dot boundary: `example.com` (or
`.example.com`) matches `example.com` and `api.example.com`, never
`evilexample.com`; case and a trailing dot are ignored; `*` matches any host.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from django.conf import settings


def normalise_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def host_matches(host: str, entries: Iterable[str]) -> bool:
    """SPEC 8: `example.com` (or `.example.com`) matches `example.com` and
    `api.example.com`, never `evilexample.com`; `*` matches any host."""
    host = normalise_host(host)
    for raw in entries:
        entry = normalise_host(raw).lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return True
    return False


_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOST_ENTRY = re.compile(rf"\.?{_LABEL}(\.{_LABEL})*\.?")


def host_entry_error(entry: str) -> str | None:
    """Why `entry` is not a host-list entry (`*`, a hostname with an optional
    leading dot, or an IP literal), or None when it is one."""
    if not isinstance(entry, str) or not entry.strip():
        return "a host entry must be a non-empty string"
    value = normalise_host(entry)
    if value == "*" or (len(value) <= 253 and _HOST_ENTRY.fullmatch(value)):
        return None
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{entry!r} is not a host name, an IP address or '*'"
    return None


def hosts_intersect(first: Iterable[str], second: Iterable[str]) -> tuple[str, ...]:
    """The entries matching exactly the hosts both lists match (suffix semantics):
    for each pair, the narrower entry when one lies within the other, else nothing.
    `("example.com",) ∩ ("api.example.com", "other.test")` = `("api.example.com",)`."""
    out: dict[str, None] = {}
    second = [normalise_host(e).lstrip(".") for e in second]
    for a in (normalise_host(e).lstrip(".") for e in first):
        for b in second:
            if a and b and host_matches(b, (a,)):
                out[b] = None
            elif a and b and host_matches(a, (b,)):
                out[a] = None
    return tuple(out)


def network_configured() -> bool:
    """SPEC 6.1 layer 1: the network tools are configured when the operator lists
    hosts (`LOOMCYCLE_HTTP_HOST_ALLOWLIST`) or lets the caller's `allowed_hosts`
    decide (`LOOMCYCLE_HTTP_CALLER_AUTHORITATIVE=1`)."""
    conf = settings.LOOMCYCLE
    return bool(conf.http_host_allowlist) or bool(conf.http_caller_authoritative)


def run_allowed_hosts(caller: Sequence[str] | None) -> tuple[str, ...]:
    """A new run's host list from the caller's three-state `allowed_hosts`
    (SPEC 6.1): omitted (None) = the operator's list; `[]` = none; a list =
    operator ∩ caller. Caller-authoritative: omitted = none, a list = the
    caller's (∩ the operator's list when that is set). `()` when not configured."""
    conf = settings.LOOMCYCLE
    operator = tuple(conf.http_host_allowlist)
    if not network_configured():
        return ()
    if caller is None:
        return () if conf.http_caller_authoritative else operator
    if conf.http_caller_authoritative and not operator:
        return tuple(dict.fromkeys(normalise_host(e).lstrip(".") for e in caller if normalise_host(e).lstrip(".")))
    return hosts_intersect(operator, caller)
