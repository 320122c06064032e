"""Fixtures shared by the driver tests: `server`, the loopback HTTP server the
`wire` fixtures script (tests/gateway/wire.py). A module may define its own."""

from tests.gateway.wire import server

__all__ = ["server"]
