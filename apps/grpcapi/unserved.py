"""The loomcycle.v1 RPCs this runtime does not serve, each answering UNIMPLEMENTED with a
message naming it and why: the runtime lacks the capability (ABSENT), or has it over HTTP and
does not serve it over gRPC yet (NOT_YET). docs/compat.md lists the same; a test checks that
every RPC of the service is either served or named here."""

from __future__ import annotations

ABSENT = "this runtime does not have this capability"
NOT_YET = "this runtime has it over HTTP (docs/compat.md) but does not serve it over gRPC yet"

UNSERVED: dict[str, str] = {
    # Capabilities loomcycle has and this runtime does not (docs/compat.md); and HookDef, whose
    # capability exists over HTTP in another shape.
    "Config": ABSENT + " (no instance-configuration report, GET /v1/config)",
    "CreateConfiguredRun": ABSENT + " (configured runs)",
    "UpdateConfiguredRun": ABSENT + " (configured runs)",
    "StartConfiguredRun": ABSENT + " (configured runs)",
    "DeleteConfiguredRun": ABSENT + " (configured runs)",
    "DirectoryUsers": ABSENT + " (directory)",
    "DirectoryInspect": ABSENT + " (directory)",
    "DirectoryTenants": ABSENT + " (directory)",
    "RetuneRun": ABSENT,
    "ReviewRun": ABSENT + " (run review)",
    "ListWalkRuns": ABSENT + " (team walks)",
    "Decide": ABSENT + " (decision models)",
    "ListDecisionModels": ABSENT + " (decision models)",
    "ResolveProbe": ABSENT + " (resolver matrix probe)",
    "MemoryBackendDef": ABSENT,
    "DocumentSourceDef": ABSENT + " (documents)",
    "TeamDef": ABSENT + " (teams)",
    "HookDef": NOT_YET + " (tool-use hooks are registered at /v1/hooks here, not as a def kind)",
    "Path": ABSENT + " (Path VFS)",
    "Document": ABSENT + " (documents)",
    "CredentialDef": ABSENT,
    "Crypto": ABSENT,
    "GroupDef": ABSENT + " (access-control lists)",
    "AclDef": ABSENT + " (access-control lists)",
    "AclBinding": ABSENT + " (access-control lists)",
    "Authz": ABSENT + " (access-control lists)",
    "History": ABSENT + " (History tool)",
    "Evaluation": ABSENT + " over an operator plane (the Evaluation tool is agent-facing only)",
    "ListTeamChannels": ABSENT + " (teams)",
    "PeekTeamChannel": ABSENT + " (teams)",
    "ReleaseTeamChannel": ABSENT + " (teams)",
    # Capabilities this runtime has over HTTP, not yet over gRPC.
}


def message(rpc: str) -> str:
    return f"loomcycle.v1.Loomcycle/{rpc}: {UNSERVED[rpc]}"
