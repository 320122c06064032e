"""Generate the gRPC stubs from the project's .proto: `python -m apps.grpcapi.stubs`.

The generated modules (loomcycle_pb2.py/.pyi, loomcycle_pb2_grpc.py, beside the .proto) are build
output, never committed: `make proto` (which `make run`/`test`/`typecheck` depend on), the
Dockerfile's proto stage and the gRPC tests' setup call this. It imports nothing of Django, so the
Docker stage that holds only grpcio-tools can run it. docs/grpc.md."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("apps/grpcapi/proto/loomcycle.proto")
GENERATED = ("loomcycle_pb2.py", "loomcycle_pb2.pyi", "loomcycle_pb2_grpc.py")


def stale(root: Path = ROOT) -> bool:
    """Whether a generated module is missing or older than the .proto."""
    source = (root / PROTO).stat().st_mtime
    outs = [root / PROTO.parent / name for name in GENERATED]
    return any(not out.exists() or out.stat().st_mtime < source for out in outs)


# The service module's import of the messages, as protoc writes it and as this package needs it.
_FLAT_IMPORT = "import loomcycle_pb2 as loomcycle__pb2"
_PACKAGE_IMPORT = "from apps.grpcapi.proto import loomcycle_pb2 as loomcycle__pb2"


def generate(root: Path = ROOT) -> None:
    """protoc over the .proto, compiled as `loomcycle.proto` (the name the official client's
    descriptor carries: the two serialize to the same bytes, so protobuf's descriptor pool takes
    both in one process, the client's and ours). Raises on a protoc error."""
    from grpc_tools import protoc  # build-time only (requirements/build.txt)

    include = str(Path(protoc.__file__).parent / "_proto")  # google/protobuf/timestamp.proto
    out = root / PROTO.parent
    argv = ["protoc", "-I", str(out), "-I", include]
    argv += [f"--{kind}_out={out}" for kind in ("python", "pyi", "grpc_python")]
    if protoc.main([*argv, str(root / PROTO)]) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    service = out / "loomcycle_pb2_grpc.py"
    text = service.read_text()
    if text.count(_FLAT_IMPORT) != 1:
        raise RuntimeError(f"unexpected protoc output: no single {_FLAT_IMPORT!r} in {service}")
    service.write_text(text.replace(_FLAT_IMPORT, _PACKAGE_IMPORT))


if __name__ == "__main__":
    generate()
    sys.stdout.write(f"generated {', '.join(GENERATED)} from {PROTO}\n")
