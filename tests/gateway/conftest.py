"""Fixtures shared by the driver tests: `server`, the loopback HTTP server the
`wire` fixtures script, and `collect` (each test over the blocking and the
async path); see tests/gateway/wire.py. A module may define its own."""

from tests.gateway.wire import collect, server

__all__ = ["collect", "server"]
