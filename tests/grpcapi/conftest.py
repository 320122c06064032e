"""The gRPC tests need the generated stubs: made here when missing or older than the .proto
(what `make test` does through `make proto`), so a bare `pytest tests/grpcapi` works too."""

from __future__ import annotations

from apps.grpcapi import stubs

if stubs.stale():
    stubs.generate()
