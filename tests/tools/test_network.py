"""HTTP and WebFetch called as the engine calls them (a ToolContext, in this
process) against real loopback servers: output format, caps, redirects,
timeouts, credential templates and every refusal. The end-to-end runs with a
real worker are in test_network_runs.py."""

from __future__ import annotations

import dataclasses
import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.core.tools import ToolRefusal
from apps.tools import httpcall
from apps.tools.httpcall import MAX_BYTES, Outbound
from apps.tools.network import NO_HOSTS, NOT_CONFIGURED, http_execute, readable_text, webfetch_execute
from tests.tools.conftest import tool_context

pytestmark = pytest.mark.usefixtures("net")


def echo_headers(request: Request) -> Response:
    body = {"headers": {k.lower(): v for k, v in request.headers.items()}, "body": request.get_data(as_text=True)}
    return Response(json.dumps(body), content_type="application/json")


@pytest.fixture
def second() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


def test_get_answers_the_spec_text_format(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/page").respond_with_data("hello", headers={"X-Served-By": "loopback"})
    url = f"http://localhost:{httpserver.port}/page"
    result = http_execute(tool_context(), {"url": url})
    assert not result.is_error, result.text
    head, _, body = result.text.partition("\n\n")
    lines = head.splitlines()
    assert lines[0] == f"HTTP GET {url} -> 200"
    assert "X-Served-By: loopback" in lines[1:]
    assert body == "hello"


def test_post_sends_the_body_and_headers_and_a_404_is_not_an_error(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/items", method="POST").respond_with_handler(echo_headers)
    url = f"http://localhost:{httpserver.port}/items"
    result = http_execute(
        tool_context(), {"method": "post", "url": url, "headers": {"X-Trace": "t-1"}, "body": '{"a": 1}'}
    )
    sent = json.loads(result.text.partition("\n\n")[2])
    assert result.text.startswith(f"HTTP POST {url} -> 200")
    assert sent["body"] == '{"a": 1}' and sent["headers"]["x-trace"] == "t-1"
    missing = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/nothing"})
    assert not missing.is_error and missing.text.startswith(
        f"HTTP GET http://localhost:{httpserver.port}/nothing -> 500"
    )


def test_credential_templates_are_filled_at_request_time_and_never_shown(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/echo").respond_with_handler(echo_headers)
    ctx = tool_context(credentials={"user_bearer": "ub-SECRET-123456", "api_key": "ak-SECRET-987654"})
    headers = {
        "Authorization": "Bearer ${run.user_bearer}",
        "X-Api-Key": "${run.credentials.api_key}",
        "X-Optional": "${run.credentials.absent:-none}",
    }
    result = http_execute(ctx, {"url": f"http://localhost:{httpserver.port}/echo", "headers": headers})
    assert not result.is_error, result.text
    received = httpserver.log[0][0].headers
    assert received["Authorization"] == "Bearer ub-SECRET-123456"
    assert received["X-Api-Key"] == "ak-SECRET-987654"
    assert received["X-Optional"] == "none"
    assert "SECRET" not in result.text  # the echo server sent them back; the output shows markers
    assert "Bearer [redacted:run.user_bearer]" in result.text
    assert "[redacted:run.credentials.api_key]" in result.text


def test_a_template_without_its_credential_or_fallback_is_refused_unsent(httpserver: HTTPServer) -> None:
    headers = {"X-Api-Key": "${run.credentials.api_key}"}
    result = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/x", "headers": headers})
    assert result.is_error and "names a credential this run does not carry" in result.text
    assert httpserver.log == []


def test_a_redirect_to_another_origin_drops_the_credential_headers(httpserver: HTTPServer, second: HTTPServer) -> None:
    second.expect_request("/landing").respond_with_handler(echo_headers)
    httpserver.expect_request("/start").respond_with_data(
        "", status=302, headers={"Location": f"http://localhost:{second.port}/landing"}
    )
    ctx = tool_context(credentials={"api_key": "ak-SECRET-987654"})
    headers = {"X-Api-Key": "${run.credentials.api_key}", "X-Plain": "kept"}
    result = http_execute(ctx, {"url": f"http://localhost:{httpserver.port}/start", "headers": headers})
    landed = second.log[0][0].headers
    assert "X-Api-Key" not in landed and landed["X-Plain"] == "kept"
    assert httpserver.log[0][0].headers["X-Api-Key"] == "ak-SECRET-987654"
    assert result.text.startswith(f"HTTP GET http://localhost:{httpserver.port}/start -> 200")


def test_more_than_five_redirects_is_an_error(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/loop").respond_with_data("", status=302, headers={"Location": "/loop"})
    result = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/loop"})
    assert result.is_error and "more than 5 redirects" in result.text
    assert len(httpserver.log) == 6  # the first request and five redirects


def test_the_response_is_cut_at_256_kib(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/big").respond_with_data(b"a" * (MAX_BYTES + 50_000))
    result = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/big"})
    body = result.text.partition("\n\n")[2]
    assert body == "a" * MAX_BYTES + f"\n[truncated at {MAX_BYTES} bytes]"


def test_a_request_body_over_256_kib_is_refused_unsent(httpserver: HTTPServer) -> None:
    data = {"method": "POST", "url": f"http://localhost:{httpserver.port}/x", "body": "b" * (MAX_BYTES + 1)}
    result = http_execute(tool_context(), data)
    assert result.is_error and f"the cap is {MAX_BYTES}" in result.text
    assert httpserver.log == []


def test_a_stalled_server_times_out(httpserver: HTTPServer) -> None:
    release = threading.Event()

    def stall(request: Request) -> Response:
        release.wait(10)
        return Response("late")

    httpserver.expect_request("/slow").respond_with_handler(stall)
    out = Outbound(method="GET", url=f"http://localhost:{httpserver.port}/slow", headers={}, secret_headers=frozenset())
    try:
        with pytest.raises(ToolRefusal, match=r"timed out after 0\.5 s"):
            httpcall.fetch(tool_context(), out, timeout=0.5)
    finally:
        release.set()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"url": "ftp://localhost/x"}, "must start with http:// or https://"),
        ({}, "url is required"),
        ({"url": "http://localhost/", "method": "TRACE"}, "method 'TRACE' is not one of"),
        ({"url": "http://localhost/", "timeout": 5}, "unknown fields ['timeout']"),
        ({"url": "http://localhost/", "headers": {"Host": "internal"}}, "header 'Host' may not be set"),
        ({"url": "http://localhost/", "headers": ["x"]}, "headers must be an object"),
        ({"url": "http://localhost/", "body": {"a": 1}}, "body must be a string"),
    ],
)
def test_bad_input_is_refused_with_a_reason(data: dict[str, Any], message: str) -> None:
    result = http_execute(tool_context(), data)
    assert result.is_error and message in result.text


def test_refusals_say_why_and_send_nothing(httpserver: HTTPServer, settings: Any) -> None:
    port = httpserver.port
    not_allowed = http_execute(tool_context(), {"url": f"http://elsewhere.test:{port}/"})
    assert not_allowed.is_error and "host 'elsewhere.test' is not in the allowed hosts" in not_allowed.text
    loopback = http_execute(
        tool_context(allowed_hosts=("localhost", "127.0.0.1")), {"url": f"http://127.0.0.1:{port}/"}
    )
    assert loopback.is_error and "'127.0.0.1' resolves to 127.0.0.1, a loopback address" in loopback.text
    no_hosts = webfetch_execute(tool_context(allowed_hosts=()), {"url": f"http://localhost:{port}/"})
    assert no_hosts.is_error and no_hosts.text == NO_HOSTS.format(tool="WebFetch")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=())
    unconfigured = http_execute(tool_context(), {"url": f"http://localhost:{port}/"})
    assert unconfigured.is_error and unconfigured.text == NOT_CONFIGURED.format(tool="HTTP")
    assert "set LOOMCYCLE_HTTP_HOST_ALLOWLIST" in unconfigured.text
    assert httpserver.log == []


PAGE = """<!doctype html><html><head><title>The  Title</title><style>p {color: red}</style>
<script>var secret = "do not show";</script></head>
<body><nav><a href="/">Home</a></nav><h1>Heading &amp; more</h1>
<p>First&nbsp;para with <b>bold</b>   and
 spaces &lt;3</p><div>Line one<br>Line two</div><ul><li>a</li><li>b</li></ul>
<noscript>enable js</noscript></body></html>"""


def test_webfetch_returns_the_readable_text_without_headers(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/page").respond_with_data(PAGE, content_type="text/html; charset=utf-8")
    url = f"http://localhost:{httpserver.port}/page"
    result = webfetch_execute(tool_context(), {"url": url})
    assert not result.is_error, result.text
    status, _, text = result.text.partition("\n\n")
    assert status == f"HTTP GET {url} -> 200"
    assert text == "The Title\n\nHome\nHeading & more\nFirst para with bold and spaces <3\nLine one\nLine two\na\nb"


def test_readable_text_drops_scripts_styles_and_collapses_whitespace() -> None:
    text = readable_text(PAGE)
    assert "secret" not in text and "color" not in text and "enable js" not in text
    assert "  " not in text and "\n\n\n" not in text


def test_webfetch_passes_plain_text_through_and_caps_it(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/notes.txt").respond_with_data("plain <b>not html</b>", content_type="text/plain")
    httpserver.expect_request("/huge").respond_with_data(
        "<p>" + "x" * (MAX_BYTES + 10) + "</p>", content_type="text/html"
    )
    plain = webfetch_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/notes.txt"})
    assert plain.text.endswith("\n\nplain <b>not html</b>")
    huge = webfetch_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/huge"})
    assert huge.text.endswith("\n[truncated]") and not huge.is_error
    assert len(huge.text.encode()) <= MAX_BYTES + 200


def test_webfetch_takes_only_a_url() -> None:
    result = webfetch_execute(tool_context(), {"url": "http://localhost/", "headers": {}})
    assert result.is_error and "unknown fields ['headers']; WebFetch takes url" in result.text


def test_a_credential_that_is_no_header_value_is_refused_unsent_and_never_quoted(httpserver: HTTPServer) -> None:
    value = "nl-SECRET-123456\n"  # credentials_check refuses it at the door; this is the tool's own guard
    ctx = tool_context(credentials={"nl": value})
    headers = {"Authorization": "Bearer ${run.credentials.nl}"}
    result = http_execute(ctx, {"url": f"http://localhost:{httpserver.port}/x", "headers": headers})
    assert result.is_error and "is not a valid HTTP header value" in result.text
    assert "${run.credentials.nl}" in result.text
    assert "nl-SECRET-123456" not in result.text
    assert httpserver.log == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"url": "http://[::1"}, "invalid url"),
        ({"url": "http://xn--a.com/"}, "invalid host name in url"),
        ({"url": "http://localhost/", "headers": {"X-Caf\u00e9": "v"}}, "a header name or value is not ASCII"),
        ({"url": "http://localhost/", "headers": {"X-Name": "caf\u00e9"}}, "is not a valid HTTP header value"),
    ],
)
def test_malformed_urls_and_headers_are_clear_refusals(
    data: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        result = http_execute(tool_context(allowed_hosts=("*",)), data)
    assert result.is_error and message in result.text, result.text
    assert not any(r.exc_info for r in caplog.records)  # a refusal, not the tool-failure path


def test_identity_is_asked_for_unless_the_call_sets_an_encoding(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/echo").respond_with_handler(echo_headers)
    url = f"http://localhost:{httpserver.port}/echo"
    plain = json.loads(http_execute(tool_context(), {"url": url}).text.partition("\n\n")[2])
    assert plain["headers"]["accept-encoding"] == "identity"
    chosen = http_execute(tool_context(), {"url": url, "headers": {"Accept-Encoding": "gzip"}})
    assert json.loads(chosen.text.partition("\n\n")[2])["headers"]["accept-encoding"] == "gzip"


def test_a_gzip_bomb_is_inflated_only_up_to_the_cap(httpserver: HTTPServer) -> None:
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)  # 256 MiB of zeros in ~250 KiB
    httpserver.expect_request("/bomb").respond_with_data(bomb, headers={"Content-Encoding": "gzip"})
    tracemalloc.start()
    try:
        result = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/bomb"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not result.is_error, result.text
    assert result.text.endswith(f"\n[truncated at {MAX_BYTES} bytes]")
    assert result.text.partition("\n\n")[2].count("\0") == MAX_BYTES
    assert peak < 16 << 20, f"peak {peak >> 20} MiB"  # a whole decoded network chunk would be ~64 MiB


def test_a_small_gzip_body_is_decoded_and_other_encodings_are_refused(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/gz").respond_with_data(gzip.compress(b"hello"), headers={"Content-Encoding": "gzip"})
    httpserver.expect_request("/br").respond_with_data(b"\x0b\x02\x80hello\x03", headers={"Content-Encoding": "br"})
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for path, body in (("/zl", zlib.compress(b"hello")), ("/raw", raw.compress(b"hello") + raw.flush())):
        httpserver.expect_request(path).respond_with_data(body, headers={"Content-Encoding": "deflate"})
    for path in ("/gz", "/zl", "/raw"):
        got = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}{path}"})
        assert got.text.partition("\n\n")[2] == "hello", (path, got.text)
    br = http_execute(tool_context(), {"url": f"http://localhost:{httpserver.port}/br"})
    assert br.is_error and "Content-Encoding 'br'" in br.text
