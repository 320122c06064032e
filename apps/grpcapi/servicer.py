"""loomcycle.v1.Loomcycle: the served RPCs (apps.grpcapi.runs, .admin) and, for every other
method of the service, a handler answering UNIMPLEMENTED with apps.grpcapi.unserved's reason
(never the generated base class's bare "Method not implemented!")."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from apps.grpcapi import unserved
from apps.grpcapi.admin import AdminRpcs
from apps.grpcapi.budgets import BudgetRpcs
from apps.grpcapi.channels import ChannelRpcs
from apps.grpcapi.control import ControlRpcs
from apps.grpcapi.data import DataRpcs
from apps.grpcapi.integration import IntegrationRpcs
from apps.grpcapi.lifecycle import LifecycleRpcs
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.grpcapi.runs import RunRpcs
from apps.grpcapi.snapshots import SnapshotRpcs

SERVICE = pb.DESCRIPTOR.services_by_name["Loomcycle"]


GROUPS: tuple[type, ...] = (
    RunRpcs,
    ControlRpcs,
    AdminRpcs,
    SnapshotRpcs,
    DataRpcs,
    ChannelRpcs,
    LifecycleRpcs,
    IntegrationRpcs,
    BudgetRpcs,
)


class Servicer(*GROUPS, pb_grpc.LoomcycleServicer):  # type: ignore[misc]
    """Every served RPC comes from one of GROUPS; every other method gets the handler
    `_install_unserved` sets below (UNIMPLEMENTED naming why)."""


def served() -> list[str]:
    """The RPCs with a handler of their own."""
    return sorted(m.name for m in SERVICE.methods if any(m.name in vars(group) for group in GROUPS))


def _unimplemented(rpc: str) -> Callable[..., Coroutine[Any, Any, None]]:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, unserved.message(rpc))

    handler.__name__ = rpc
    return handler


def _install_unserved() -> None:
    for method in SERVICE.methods:
        if method.name not in served():
            setattr(Servicer, method.name, _unimplemented(method.name))


_install_unserved()
