"""OpenTelemetry GenAI semantic conventions (semconv 1.37+): the attribute names loomcycle's spans
use and the two client metrics, in one place for the runs app and the gateway.

Metrics (recorded through the global MeterProvider; loomcycle_project.telemetry installs one beside
the tracer provider, so with no exporter configured they are the API's no-ops):
- `gen_ai.client.token.usage` (histogram, `{token}`): one point per call and token type;
- `gen_ai.client.operation.duration` (histogram, `s`): one point per call, `error.type` on a failure.
"""

from __future__ import annotations

from typing import Protocol

from opentelemetry import metrics
from opentelemetry.util.types import AnyValue

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"  # not the deprecated gen_ai.system
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOKEN_TYPE = "gen_ai.token.type"  # noqa: S105 (an attribute name, not a credential)
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"

# The semconv's advisory bucket boundaries for each histogram.
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]


def instruments(meter: metrics.Meter) -> tuple[metrics.Histogram, metrics.Histogram]:
    """The two histograms on `meter`: (token usage, operation duration)."""
    tokens = meter.create_histogram(
        "gen_ai.client.token.usage",
        unit="{token}",
        description="Number of input and output tokens used",
        explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
    )
    duration = meter.create_histogram(
        "gen_ai.client.operation.duration",
        unit="s",
        description="GenAI operation duration",
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
    )
    return tokens, duration


# On the global MeterProvider (the API's proxy binds them to the one installed later).
_token_usage, _duration = instruments(metrics.get_meter("loomcycle.genai"))


def call_attributes(operation: str, provider: str, request_model: str, response_model: str = "") -> dict[str, AnyValue]:
    """The attributes both metrics carry (response model only when known)."""
    out: dict[str, AnyValue] = {OPERATION: operation, PROVIDER: provider, REQUEST_MODEL: request_model}
    if response_model:
        out[RESPONSE_MODEL] = response_model
    return out


class _Usage(Protocol):
    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...


def record_tokens(attributes: dict[str, AnyValue], usage: _Usage) -> None:
    _token_usage.record(usage.input_tokens, {**attributes, TOKEN_TYPE: "input"})
    _token_usage.record(usage.output_tokens, {**attributes, TOKEN_TYPE: "output"})


def record_call(attributes: dict[str, AnyValue], *, seconds: float, error: str) -> None:
    """One finished call's duration (`error.type` when it failed)."""
    _duration.record(seconds, {**attributes, ERROR_TYPE: error} if error else attributes)
