"""A loopback hook callback server speaking the real wire: JSON POSTs in,
JSON (or an empty 204, or a 5xx) out. Each path is one hook's endpoint; a
test programs what each path answers and reads what each received."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, Any]], tuple[int, Any]]  # payload -> (status, JSON body or None for empty)


@dataclass
class HookServer:
    base: str
    answers: dict[str, Answer] = field(default_factory=dict)
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (path, payload) in arrival order
    release: threading.Event = field(default_factory=threading.Event)  # frees handlers that `hold`
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def on(self, path: str, answer: Answer) -> str:
        self.answers[path] = answer
        return self.url(path)

    def calls(self, path: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [p for at, p in self.received if path is None or at == path]

    def order(self) -> list[str]:
        with self.lock:
            return [at for at, _ in self.received]


def reply(body: Any, status: int = 200) -> Answer:
    return lambda payload: (status, body)


def hold(server: HookServer) -> Answer:
    """Answer only when the test sets `server.release` (a callback that outlives its timeout)."""

    def answer(payload: dict[str, Any]) -> tuple[int, Any]:
        server.release.wait(120)
        return 200, {}

    return answer


def _handler(server: HookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            payload = json.loads(raw)
            with server.lock:
                server.received.append((self.path, payload))
            answer = server.answers.get(self.path, reply(None, 404))
            status, body = answer(payload)
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextmanager
def hook_server() -> Iterator[HookServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server = HookServer(base=f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = _handler(server)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="hook-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
