"""The command line's shared state: one Client per invocation, and its exit codes."""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from loomcycle_http.client import Client

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed (its error is on stderr)
EXIT_CANCELLED = 3  # the run was cancelled by someone else
EXIT_REFUSED = 4  # the API refused the request (its code and message are on stderr)
EXIT_UNREACHABLE = 5  # the runtime could not be reached
EXIT_INTERRUPTED = 130  # Ctrl-C: the run was cancelled


@dataclass
class Ctx:
    url: str | None
    token: str | None
    _client: Client | None = field(default=None, init=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.url, self.token)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


pass_ctx = click.make_pass_decorator(Ctx)
