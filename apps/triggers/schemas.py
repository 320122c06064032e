"""Response schemas of the triggers routes (schedules, hooks, webhooks) for /v1/openapi.json.
The routes answer with the dicts apps.triggers.presenters, hooks.presenters and
webhooks.receive build; these models document them (tests/core/test_api_fuzz.py checks
answers against the schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ScheduleStateOut(BaseModel):
    def_id: str
    name: str
    tenant_id: str
    last_run_at: str | None
    last_run_id: str
    last_status: str
    last_error: str
    next_run_at: str | None
    paused_until: str | None
    fire_count: int


class ScheduleEntryOut(ScheduleStateOut):
    version: int
    agent: str
    schedule: str
    user_tier_schedules: Any
    timezone: str
    enabled: bool
    max_fires: int
    catch_up_max: int


class SchedulesOut(BaseModel):
    entries: list[ScheduleEntryOut]


class ScheduleRunNowOut(BaseModel):
    def_id: str
    scheduled: str  # "next-tick"


class SchedulePausedOut(BaseModel):
    def_id: str
    paused: bool


class HookOut(BaseModel):
    id: str
    tenant_id: str
    owner: str
    name: str
    phase: str
    agents: list[str]
    tools: list[str]
    callback_url: str
    fail_mode: str
    timeout_ms: int
    created_at: str
    updated_at: str


class HooksOut(BaseModel):
    hooks: list[HookOut]


class HookRegisteredOut(BaseModel):
    id: str


class HookDeletedOut(BaseModel):
    deleted: str  # the hook's id


class WebhookDeliveryOut(BaseModel):
    delivery_id: str
    verdict: str
    received_at: str
    run_id: str
    channel: str
    tenant_id: str
    detail: str


class WebhookDeliveriesOut(BaseModel):
    webhook_name: str
    deliveries: list[WebhookDeliveryOut]


class WebhookDryRunOut(BaseModel):
    """What a delivery would do; `code` and `error` say why when `would_accept` is false."""

    model_config = ConfigDict(extra="allow")

    would_accept: bool
    verdict: str
    code: str | None = None
    error: str | None = None
    run_input_preview: dict[str, Any]
