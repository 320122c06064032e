"""`POST /v1/runs:batch` (SPEC 2.3): auth -> schema -> service -> envelope.
The rules (limits, the join, the wait) are apps.runs.children.batch's."""

from __future__ import annotations

import dataclasses
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.types import Principal
from apps.gateway.fairness.streams import astream_slot
from apps.runs.api import run_create_data
from apps.runs.children import batch
from apps.runs.children.schemas import BatchIn, BatchOut, BatchSpawnIn

router = Router(tags=["runs"])

MAX_BATCH_BYTES = 8 * 1024 * 1024  # SPEC 2.0's body cap for runs:batch


def _spawn(data: BatchSpawnIn) -> batch.BatchSpawn:
    # POST /v1/runs's mapping; a batch child never joins a session (SPEC: runs:batch ignores session_id).
    create = dataclasses.replace(run_create_data(data), session_id=None, multitask_strategy=None)
    return batch.BatchSpawn(create=create, parent_context=create.options.parent_context)


def _start(principal: Principal, data: BatchIn) -> str:
    return batch.batch_start(principal=principal, spawns=[_spawn(s) for s in data.spawns])


def _detach(principal: Principal, data: BatchIn) -> dict[str, object]:
    return batch.batch_detach(principal=principal, spawns=[_spawn(s) for s in data.spawns])


@router.post(
    "/runs:batch",
    response={200: BatchOut},
    openapi_extra=openapi_body(BatchIn),
    summary="Fan out up to 32 runs; join waits for all of them, detach answers their handles at once",
)
async def runs_batch(request: HttpRequest) -> JsonResponse:
    data = parse_body(request, BatchIn, max_bytes=MAX_BATCH_BYTES)
    return JsonResponse(await batch_answer(request_principal(request), data))


async def batch_answer(principal: Principal, data: BatchIn) -> dict[str, Any]:
    """The batch's answer, as POST /v1/runs:batch gives it (gRPC's SpawnRunBatch calls this too)."""
    batch.batch_check(count=len(data.spawns), mode=data.mode, timeout_ms=data.timeout_ms)
    if data.mode == "detach":  # answered at once: no stream slot, no join
        return dict(await sync_to_async(_detach, thread_sensitive=False)(principal, data))
    # The request is held open up to 30 min, as a stream is: it holds one of the principal's
    # stream slots (LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL), taken before any run exists (a 429
    # here starts nothing) and given back when it answers or its client leaves.
    slot = await astream_slot(principal)
    late: frozenset[str] = frozenset()
    async with slot.held():
        fanout_id = await sync_to_async(_start, thread_sensitive=False)(principal, data)
        if not await batch.batch_await(fanout_id, data.timeout()):
            cancel = sync_to_async(batch.batch_cancel_unfinished, thread_sensitive=False)
            late = await cancel(principal=principal, fanout_id=fanout_id)
    result: dict[str, Any] = await sync_to_async(batch.batch_result, thread_sensitive=False)(
        fanout_id=fanout_id, timed_out=late
    )
    return result
