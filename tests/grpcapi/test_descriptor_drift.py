"""The project's loomcycle.v1 descriptors against the official client's (loomcycle==1.124.0):
any difference in package, service, method, streaming, message or field fails."""

from __future__ import annotations

from tests.grpcapi.wire import drift, official_descriptor, project_descriptor, wire_facts


def test_project_proto_matches_the_official_client_wire() -> None:
    ours, theirs = project_descriptor(), official_descriptor()
    assert theirs.package == "loomcycle.v1"
    assert [s.name for s in theirs.service] == ["Loomcycle"]
    assert drift(ours, theirs) == []
    assert len([f for f in wire_facts(ours) if f.startswith("service ")]) == len(theirs.service[0].method) == 80


def test_drift_names_a_changed_field_number_and_a_streaming_flag() -> None:
    """The comparison is not vacuous: a renumbered field and a method that stops streaming
    are each reported, from both sides."""
    ours, theirs = project_descriptor(), official_descriptor()
    run = next(m for m in ours.message_type if m.name == "RunRequest")
    agent = next(f for f in run.field if f.name == "agent")
    agent.number = 99
    method = next(m for m in ours.service[0].method if m.name == "StreamRun")
    method.server_streaming = False
    report = drift(ours, theirs)
    assert any(line.startswith("- message .loomcycle.v1.RunRequest field 1 agent") for line in report)
    assert any(line.startswith("+ message .loomcycle.v1.RunRequest field 99 agent") for line in report)
    assert any("rpc StreamRun" in line and "server_streaming=True" in line for line in report if line[0] == "-")
    assert len(report) == 4


def test_official_client_and_project_stubs_share_one_descriptor_in_one_process() -> None:
    """Compiled as `loomcycle.proto`, the project's descriptor serializes to the official
    client's bytes, so protobuf's pool takes both modules in one process (a test driving the
    runtime with the official client beside the project's stubs)."""
    from google.protobuf import descriptor_pb2

    from tests.grpcapi.wire import official_pb2_source, serialized_descriptor

    theirs = serialized_descriptor(official_pb2_source())
    ours = project_descriptor().SerializeToString()
    assert descriptor_pb2.FileDescriptorProto.FromString(theirs).name == project_descriptor().name == "loomcycle.proto"
    assert ours == theirs
