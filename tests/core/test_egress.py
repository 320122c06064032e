"""The SSRF guard (apps.core.egress) against real loopback servers: every
refused range, names that resolve to loopback, redirects, DNS rebinding,
allowlist edges, TLS keeping the name, and the async twin.

The resolver seam stands in for DNS (no name server here); the recording
backend is httpcore's real SyncBackend/AnyIOBackend that notes each address it
is asked to dial, and can route one documentation-free public address to the
loopback server, standing in for "the internet" in the rebinding test."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import ssl
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pytest_httpserver import HTTPServer

from apps.core import egress, hosts
from apps.core.egress import EgressRefused, HostPolicy

PUBLIC = "93.184.216.34"  # a global address; the recording backend routes it to loopback


class Recorder(httpcore.SyncBackend):
    """The real sync backend, noting every (address, port) dialled."""

    def __init__(self, route_public_to_loopback: bool = False) -> None:
        self.dialled: list[tuple[str, int]] = []
        self.route = route_public_to_loopback

    def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        self.dialled.append((host, port))
        target = "127.0.0.1" if self.route and host == PUBLIC else host
        return super().connect_tcp(target, port, *args, **kwargs)


class AsyncRecorder(httpcore.AnyIOBackend):
    def __init__(self) -> None:
        self.dialled: list[tuple[str, int]] = []

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        self.dialled.append((host, port))
        return await super().connect_tcp(host, port, *args, **kwargs)


class Resolver:
    """Answers from a table (a list per name: one answer per lookup, the last repeats)."""

    def __init__(self, table: dict[str, list[Sequence[str]]]) -> None:
        self.table = table
        self.lookups: list[str] = []

    def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        answers = self.table[host]
        return answers[min(len(self.lookups) - 1, len(answers) - 1)] if len(answers) > 1 else answers[0]


def one(host: str, *addresses: str) -> Resolver:
    return Resolver({host: [addresses]})


@pytest.fixture
def page(httpserver: HTTPServer) -> HTTPServer:
    httpserver.expect_request("/page").respond_with_data("hello from loopback")
    return httpserver


BLOCKED = [
    "127.0.0.1",
    "127.9.9.9",
    "10.1.2.3",
    "172.16.5.4",
    "172.31.255.255",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "169.254.1.1",
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "192.0.2.10",
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fec0::1",  # site-local (deprecated, RFC 3879): not in Python's is_private
    "feff:ffff::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "2002:7f00:1::1",  # 6to4 around 127.0.0.1
    "2001:db8::1",
]


@pytest.mark.parametrize("address", BLOCKED)
def test_each_blocked_range_is_refused_before_any_connect(page: HTTPServer, address: str) -> None:
    backend = Recorder()
    with egress.client(
        policy=HostPolicy(allowed=None), timeout=5, resolver=one("target.test", address), backend=backend
    ) as c:
        with pytest.raises(EgressRefused) as err:
            c.get(f"http://target.test:{page.port}/page")
    assert str(ipaddress.ip_address(address)) in err.value.reason
    assert "LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST" in err.value.reason
    assert backend.dialled == []
    assert page.log == []


@pytest.mark.parametrize("address", ["fec0::1", "fec0:1::2", "feff:ffff::1"])
def test_site_local_ipv6_is_named_as_such(address: str) -> None:
    assert egress.address_refusal(ipaddress.ip_address(address)) == "site-local (fec0::/10, deprecated)"


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass_the_address_check(address: str) -> None:
    assert egress.address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "2130706433"])
def test_names_and_literals_that_reach_loopback_are_refused(page: HTTPServer, host: str) -> None:
    with egress.client(policy=HostPolicy(allowed=None), timeout=5) as c:
        with pytest.raises(EgressRefused, match="loopback"):
            c.get(f"http://{host}:{page.port}/page")
    assert page.log == []


def test_a_private_allowlisted_host_connects_to_the_address_it_resolved(page: HTTPServer) -> None:
    backend = Recorder()
    policy = HostPolicy(allowed=None, private_allowlist=("localhost",))
    with egress.client(policy=policy, timeout=5, backend=backend) as c:
        resp = c.get(f"http://localhost:{page.port}/page")
    assert resp.status_code == 200 and resp.text == "hello from loopback"
    assert backend.dialled[0][0] in ("127.0.0.1", "::1")  # an address, never the name
    assert page.log[0][0].headers["Host"] == f"localhost:{page.port}"


def test_a_redirect_to_a_private_address_is_refused(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/start").respond_with_data(
        "", status=302, headers={"Location": f"http://localhost:{httpserver.port}/secret"}
    )
    httpserver.expect_request("/secret").respond_with_data("internal")
    resolver = Resolver({"front.test": [["127.0.0.1"]], "localhost": [["127.0.0.1"]]})
    policy = HostPolicy(allowed=None, private_allowlist=("front.test",))
    with egress.client(policy=policy, timeout=5, resolver=resolver) as c:
        with pytest.raises(EgressRefused, match=re.escape("'localhost' resolves to 127.0.0.1, a loopback")):
            c.get(f"http://front.test:{httpserver.port}/start")
    assert [entry[0].path for entry in httpserver.log] == ["/start"]


def test_a_redirect_to_a_host_outside_the_allowlist_is_refused_unresolved(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/start").respond_with_data(
        "", status=301, headers={"Location": f"http://elsewhere.test:{httpserver.port}/x"}
    )
    resolver = Resolver({"api.example.com": [["127.0.0.1"]]})
    policy = HostPolicy(allowed=("example.com",), private_allowlist=("example.com",))
    with egress.client(policy=policy, timeout=5, resolver=resolver) as c:
        with pytest.raises(EgressRefused, match=re.escape("'elsewhere.test' is not in the allowed hosts")):
            c.get(f"http://api.example.com:{httpserver.port}/start")
    assert resolver.lookups == ["api.example.com"]


def test_redirects_past_the_cap_stop(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/loop").respond_with_data("", status=302, headers={"Location": "/loop"})
    policy = HostPolicy(allowed=None, private_allowlist=("127.0.0.1",))
    with egress.client(policy=policy, timeout=5, max_redirects=2) as c:
        with pytest.raises(httpx.TooManyRedirects):
            c.get(f"http://127.0.0.1:{httpserver.port}/loop")
    assert len(httpserver.log) == 3


def test_rebinding_the_connect_uses_the_first_checked_address(page: HTTPServer) -> None:
    resolver = Resolver({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
    backend = Recorder(route_public_to_loopback=True)
    with egress.client(policy=HostPolicy(allowed=None), timeout=5, resolver=resolver, backend=backend) as c:
        resp = c.get(f"http://rebind.test:{page.port}/page")
    assert resp.status_code == 200
    assert resolver.lookups == ["rebind.test"]  # resolved once; the name is never dialled
    assert backend.dialled == [(PUBLIC, page.port)]
    # The next connection resolves again, and the private answer is refused.
    with egress.client(policy=HostPolicy(allowed=None), timeout=5, resolver=resolver, backend=backend) as c:
        with pytest.raises(EgressRefused, match=re.escape("rebind.test")):
            c.get(f"http://rebind.test:{page.port}/page")
    assert backend.dialled == [(PUBLIC, page.port)]
    assert len(page.log) == 1


def test_a_mixed_public_and_private_answer_is_refused(page: HTTPServer) -> None:
    backend = Recorder(route_public_to_loopback=True)
    resolver = one("mixed.test", PUBLIC, "10.0.0.5")
    with egress.client(policy=HostPolicy(allowed=None), timeout=5, resolver=resolver, backend=backend) as c:
        with pytest.raises(EgressRefused, match=re.escape("10.0.0.5")):
            c.get(f"http://mixed.test:{page.port}/page")
    assert backend.dialled == []


@pytest.mark.parametrize(
    ("host", "entries", "matches"),
    [
        ("example.com", ("example.com",), True),
        ("api.example.com", ("example.com",), True),
        ("a.b.example.com", (".example.com",), True),
        ("evilexample.com", ("example.com",), False),
        ("example.com.evil.test", ("example.com",), False),
        ("example.com.", ("example.com",), True),
        ("API.Example.COM", ("example.com.",), True),
        ("example.com", ("api.example.com",), False),
        ("anything.test", ("*",), True),
        ("example.com", ("",), False),
        ("example.com", (), False),
    ],
)
def test_allowlist_matching_is_a_suffix_at_a_dot_boundary(host: str, entries: tuple[str, ...], matches: bool) -> None:
    assert hosts.host_matches(host, entries) is matches


def test_allowlist_edges_through_the_client(page: HTTPServer) -> None:
    resolver = Resolver({"api.example.com": [["127.0.0.1"]], "example.com.": [["127.0.0.1"]]})
    policy = HostPolicy(allowed=("example.com",), private_allowlist=("example.com",))
    with egress.client(policy=policy, timeout=5, resolver=resolver) as c:
        assert c.get(f"http://api.example.com:{page.port}/page").status_code == 200
        assert c.get(f"http://example.com.:{page.port}/page").status_code == 200
        with pytest.raises(EgressRefused, match=re.escape("'evilexample.com' is not in the allowed hosts")):
            c.get(f"http://evilexample.com:{page.port}/page")
    assert resolver.lookups == ["api.example.com", "example.com."]


def test_an_empty_allowlist_refuses_with_no_lookup_and_no_request(page: HTTPServer) -> None:
    resolver, backend = one("localhost", "127.0.0.1"), Recorder()
    policy = HostPolicy(allowed=(), private_allowlist=("*",))
    with egress.client(policy=policy, timeout=5, resolver=resolver, backend=backend) as c:
        with pytest.raises(EgressRefused, match="allowed host list is empty"):
            c.get(f"http://localhost:{page.port}/page")
    assert resolver.lookups == [] and backend.dialled == [] and page.log == []


def test_other_schemes_and_transport_overrides_are_refused() -> None:
    with egress.client(policy=HostPolicy(allowed=None), timeout=5) as c:
        with pytest.raises(EgressRefused, match="scheme 'ftp'"):
            c.get("ftp://example.com/x")
    with pytest.raises(TypeError, match="transport"):
        egress.client(policy=HostPolicy(allowed=None), timeout=5, transport=httpx.HTTPTransport())


def test_environment_proxies_are_ignored(page: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    policy = HostPolicy(allowed=None, private_allowlist=("127.0.0.1",))
    with egress.client(policy=policy, timeout=5) as c:
        assert c.get(f"http://127.0.0.1:{page.port}/page").text == "hello from loopback"


def test_operator_policy_reads_the_private_allowlist_from_settings(settings: Any) -> None:
    import dataclasses

    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("intranet.test",))
    assert egress.operator_policy(("a.test",)) == HostPolicy(allowed=("a.test",), private_allowlist=("intranet.test",))


# TLS: the connection goes to the checked address, the handshake still names the host.


def _certificate(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (its own CA), as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[HTTPServer, Path]]:
    cert, key = _certificate(tmp_path, "secure.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = HTTPServer(host="127.0.0.1", port=0, ssl_context=context)
    server.expect_request("/tls").respond_with_data("over tls")
    server.start()
    try:
        yield server, cert
    finally:
        server.clear()
        server.stop()


def test_tls_keeps_the_name_for_sni_and_certificate_checks(tls_server: tuple[HTTPServer, Path]) -> None:
    server, cert = tls_server
    verify = ssl.create_default_context(cafile=str(cert))
    resolver = Resolver({"secure.test": [["127.0.0.1"]], "other.test": [["127.0.0.1"]]})
    backend = Recorder()
    policy = HostPolicy(allowed=None, private_allowlist=("secure.test", "other.test"))
    with egress.client(policy=policy, timeout=5, resolver=resolver, backend=backend, verify=verify) as c:
        assert c.get(f"https://secure.test:{server.port}/tls").text == "over tls"
        with pytest.raises(httpx.ConnectError, match=re.escape("other.test")):
            c.get(f"https://other.test:{server.port}/tls")  # same address, a name the certificate lacks
    assert backend.dialled == [("127.0.0.1", server.port)] * 2


# The async twin.


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_client_refuses_private_and_follows_allowed(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/start").respond_with_data("", status=302, headers={"Location": "/page"})
    httpserver.expect_request("/page").respond_with_data("async hello")
    backend = AsyncRecorder()

    async def go() -> tuple[str, str]:
        policy = HostPolicy(allowed=None, private_allowlist=("ok.test",))
        resolver = Resolver({"ok.test": [["127.0.0.1"]], "bad.test": [["127.0.0.1"]]})
        async with egress.async_client(policy=policy, timeout=5, resolver=resolver, backend=backend) as c:
            text = (await c.get(f"http://ok.test:{httpserver.port}/start")).text
            with pytest.raises(EgressRefused) as err:
                await c.get(f"http://bad.test:{httpserver.port}/page")
        return text, err.value.reason

    text, reason = _run(go())
    assert text == "async hello"
    assert "'bad.test' resolves to 127.0.0.1, a loopback address" in reason
    assert set(backend.dialled) == {("127.0.0.1", httpserver.port)}  # never bad.test's
    assert [entry[0].path for entry in httpserver.log] == ["/start", "/page"]


def test_async_client_with_an_empty_allowlist_sends_nothing(page: HTTPServer) -> None:
    backend = AsyncRecorder()

    async def go() -> None:
        async with egress.async_client(policy=HostPolicy(allowed=()), timeout=5, backend=backend) as c:
            await c.get(f"http://127.0.0.1:{page.port}/page")

    with pytest.raises(EgressRefused):
        _run(go())
    assert backend.dialled == [] and page.log == []


def test_international_names_are_matched_in_their_punycode_form(page: HTTPServer) -> None:
    resolver = Resolver({"xn--bcher-kva.test": [["127.0.0.1"]]})
    policy = HostPolicy(allowed=("xn--bcher-kva.test",), private_allowlist=("xn--bcher-kva.test",))
    with egress.client(policy=policy, timeout=5, resolver=resolver) as c:
        assert c.get(f"http://bücher.test:{page.port}/page").status_code == 200
    assert resolver.lookups == ["xn--bcher-kva.test"]
