"""The official client's wire, read from the pinned `loomcycle` distribution (requirements/dev.txt:
loomcycle==1.124.0) without importing it: the serialized FileDescriptorProto is read off its
generated module's source (the AddSerializedFile literal), so a drifted .proto is reported as a
difference, not as a descriptor-pool clash at import."""

from __future__ import annotations

import ast
from importlib import metadata

from google.protobuf import descriptor_pb2

OFFICIAL_VERSION = "1.124.0"
PB2_IN_DIST = "loomcycle/_generated/loomcycle_pb2.py"


def official_pb2_source() -> str:
    dist = metadata.distribution("loomcycle")
    assert dist.version == OFFICIAL_VERSION, f"requirements/dev.txt pins loomcycle=={OFFICIAL_VERSION}"
    return dist.locate_file(PB2_IN_DIST).read_text()  # type: ignore[union-attr]


def serialized_descriptor(source: str) -> bytes:
    """The bytes literal a protoc-generated Python module hands to AddSerializedFile."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            arg = node.args[0]
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, bytes)
            return arg.value
    raise AssertionError("no AddSerializedFile call in the generated module")


def official_descriptor() -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(serialized_descriptor(official_pb2_source()))


def project_descriptor() -> descriptor_pb2.FileDescriptorProto:
    from apps.grpcapi.proto import loomcycle_pb2

    out = descriptor_pb2.FileDescriptorProto()
    loomcycle_pb2.DESCRIPTOR.CopyToProto(out)
    return out


def _message_facts(msg: descriptor_pb2.DescriptorProto, scope: str) -> list[str]:
    name = f"{scope}{msg.name}"
    facts = [f"message {name} map_entry={msg.options.map_entry}"]
    facts += [f"message {name} oneof {i} {o.name}" for i, o in enumerate(msg.oneof_decl)]
    for f in msg.field:
        oneof = f.oneof_index if f.HasField("oneof_index") else "-"
        facts.append(
            f"message {name} field {f.number} {f.name} type={f.type} label={f.label} "
            f"type_name={f.type_name} proto3_optional={f.proto3_optional} oneof={oneof}"
        )
    for nested in msg.nested_type:
        facts += _message_facts(nested, f"{name}.")
    return facts


def wire_facts(fdp: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Everything of a descriptor that decides the wire: package, imports, messages with every
    field's number, name, type, label and oneof, enums, and each method's types and streaming.
    Not the file's name (it differs by where the .proto sits) nor json_name (protoc drops it)."""
    facts = {f"package {fdp.package}", f"syntax {fdp.syntax}"}
    facts |= {f"import {dep}" for dep in fdp.dependency}
    for msg in fdp.message_type:
        facts |= set(_message_facts(msg, f".{fdp.package}."))
    for enum in fdp.enum_type:
        facts |= {f"enum {enum.name} {v.name}={v.number}" for v in enum.value}
    for svc in fdp.service:
        for m in svc.method:
            facts.add(
                f"service {fdp.package}.{svc.name} rpc {m.name}({m.input_type}) -> {m.output_type} "
                f"client_streaming={m.client_streaming} server_streaming={m.server_streaming}"
            )
    return facts


def drift(ours: descriptor_pb2.FileDescriptorProto, theirs: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Each wire fact one side has and the other lacks, `-` theirs only, `+` ours only."""
    a, b = wire_facts(ours), wire_facts(theirs)
    return sorted(f"- {x}" for x in b - a) + sorted(f"+ {x}" for x in a - b)
