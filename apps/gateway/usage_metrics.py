"""Spend counters (issue 37; apps.core.metrics, exposed at /metrics): tokens by
kind and list-price cost, by provider, model and tenant, for run steps and
gateway calls alike. The tenant label is bounded at the scrape
(loomcycle_project.metrics folds every tenant past LOOMCYCLE_METRICS_TENANT_LABELS
into `other`); provider and model are the operator's configured ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apps.core.metrics import Batch, Counter

USAGE_TOKENS = Counter(
    "loomcycle_usage_tokens",
    "Tokens spent on provider calls, by kind (input, output, cache_write, cache_read).",
    ("provider", "model", "tenant", "kind"),
)
USAGE_COST = Counter(
    "loomcycle_usage_cost_usd", "List-price cost of priced provider calls, USD.", ("provider", "model", "tenant")
)
_KINDS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cache_write", "cache_creation_input_tokens"),
    ("cache_read", "cache_read_input_tokens"),
)


def count_usage(batch: Batch, *, tenant_id: str, entry: Mapping[str, Any]) -> None:
    """One ledger entry ({provider, model, <token counts>, cost_usd}) into `batch` (no I/O)."""
    provider, model = str(entry.get("provider", "")), str(entry.get("model", ""))
    for kind, key in _KINDS:
        if n := int(entry.get(key) or 0):
            batch.inc(USAGE_TOKENS, (provider, model, tenant_id, kind), n)
    if entry.get("cost_usd") is not None:
        batch.inc(USAGE_COST, (provider, model, tenant_id), float(entry["cost_usd"]))
