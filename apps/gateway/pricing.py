"""List prices of well-known models, for the usage ledger's `cost_usd`.

USD per million tokens: (input, output, cache write, cache read). `Usage`
counts tokens the Anthropic way: `input_tokens` excludes the tokens written
to or read from the prompt cache, which are priced separately (drivers of
providers that report cached tokens inside the prompt count, as OpenAI does,
subtract them). A model is matched exactly, or with a dated snapshot suffix
(`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`, `...-latest`); anything
else is unpriced (`None`), never guessed. The mock providers cost 0. The
operator's yaml `prices:` block overrides or extends this table (`operator_prices`).

Sources (list prices, standard tier, no batch discount, prompts under the
long-context threshold): Anthropic https://platform.claude.com/docs/en/about-claude/pricing,
OpenAI https://platform.openai.com/docs/pricing, DeepSeek
https://api-docs.deepseek.com/quick_start/pricing, Google
https://ai.google.dev/gemini-api/docs/pricing. Prices change: this table is
a starting point for cost reports, not an invoice.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from apps.core.config import runtime_config
from apps.core.errors import Invalid
from apps.gateway.providers.base import Usage

Price = tuple[str, str, str, str]  # input, output, cache write, cache read (USD per 1M tokens)

_ANTHROPIC: dict[str, Price] = {
    "claude-opus-4-7": ("5", "25", "6.25", "0.50"),
    "claude-opus-4-6": ("5", "25", "6.25", "0.50"),
    "claude-opus-4-5": ("5", "25", "6.25", "0.50"),
    "claude-opus-4-1": ("15", "75", "18.75", "1.50"),
    "claude-opus-4-0": ("15", "75", "18.75", "1.50"),
    "claude-opus-4": ("15", "75", "18.75", "1.50"),
    "claude-sonnet-4-6": ("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-5": ("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-0": ("3", "15", "3.75", "0.30"),
    "claude-sonnet-4": ("3", "15", "3.75", "0.30"),
    "claude-3-7-sonnet": ("3", "15", "3.75", "0.30"),
    "claude-haiku-4-5": ("1", "5", "1.25", "0.10"),
    "claude-3-5-haiku": ("0.80", "4", "1", "0.08"),
}
_OPENAI: dict[str, Price] = {  # OpenAI has no cache-write charge
    "gpt-5": ("1.25", "10", "0", "0.125"),
    "gpt-5-mini": ("0.25", "2", "0", "0.025"),
    "gpt-5-nano": ("0.05", "0.40", "0", "0.005"),
    "gpt-4.1": ("2", "8", "0", "0.50"),
    "gpt-4.1-mini": ("0.40", "1.60", "0", "0.10"),
    "gpt-4.1-nano": ("0.10", "0.40", "0", "0.025"),
    "gpt-4o": ("2.50", "10", "0", "1.25"),
    "gpt-4o-mini": ("0.15", "0.60", "0", "0.075"),
    "o3": ("2", "8", "0", "0.50"),
    "o4-mini": ("1.10", "4.40", "0", "0.275"),
}
_DEEPSEEK: dict[str, Price] = {
    "deepseek-chat": ("0.28", "0.42", "0", "0.028"),
    "deepseek-reasoner": ("0.28", "0.42", "0", "0.028"),
}
_GEMINI: dict[str, Price] = {
    "gemini-2.5-pro": ("1.25", "10", "0", "0.31"),
    "gemini-2.5-flash": ("0.30", "2.50", "0", "0.075"),
    "gemini-2.0-flash": ("0.10", "0.40", "0", "0.025"),
}
PRICES: dict[str, dict[str, Price]] = {
    "anthropic": _ANTHROPIC,
    "openai": _OPENAI,
    "deepseek": _DEEPSEEK,
    "gemini": _GEMINI,
}
FREE_PROVIDERS = frozenset({"mock", "mock-stable"})

_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_MILLION = Decimal(1_000_000)
_QUANTUM = Decimal("0.000001")  # the ledger column's scale


_KINDS = ("input", "output", "cache_write", "cache_read")


def operator_prices(config: dict[str, Any]) -> dict[str, dict[str, Price]]:
    """The yaml `prices:` block, `{provider: {model: {input, output, cache_write, cache_read,
    currency}}}` in USD per million tokens: an entry replaces the built-in price of that model
    (a kind left out costs 0). Only `currency: USD` is accepted: the ledger's column is USD."""
    out: dict[str, dict[str, Price]] = {}
    for provider, models in (config.get("prices") or {}).items():
        for model, entry in (models or {}).items():
            where = f"prices.{provider}.{model}"
            if not isinstance(entry, dict) or set(entry) - {*_KINDS, "currency"}:
                raise Invalid(f"{where}: want a mapping of {', '.join(_KINDS)}, currency", code="config_invalid")
            if str(entry.get("currency", "USD")).upper() != "USD":
                raise Invalid(f"{where}: currency must be USD (the usage ledger counts USD)", code="config_invalid")
            try:
                price = tuple(str(Decimal(str(entry.get(k, 0)))) for k in _KINDS)
            except InvalidOperation as exc:
                raise Invalid(f"{where}: prices must be numbers", code="config_invalid") from exc
            out.setdefault(str(provider), {})[str(model)] = price  # type: ignore[assignment]
    return out


_PARSED: dict[int, dict[str, dict[str, Price]]] = {}  # per loaded configuration (runtime_config reads once)


def price_for(provider: str, model: str) -> Price | None:
    """The operator's yaml price first, then the built-in table."""
    config = runtime_config()
    if (parsed := _PARSED.get(id(config))) is None:
        parsed = _PARSED[id(config)] = operator_prices(config)
    for table in (parsed.get(provider), PRICES.get(provider)):
        if table is not None and (found := table.get(model) or table.get(_SNAPSHOT.sub("", model))):
            return found
    return None


def cost_usd(provider: str, model: str, usage: Usage) -> Decimal | None:
    """The call's list price in USD (6 decimals), or None when the model has no known price."""
    if provider in FREE_PROVIDERS:
        return Decimal("0.000000")
    price = price_for(provider, model)
    if price is None:
        return None
    rate_in, rate_out, rate_write, rate_read = (Decimal(p) for p in price)
    total = (
        usage.input_tokens * rate_in
        + usage.output_tokens * rate_out
        + usage.cache_creation_input_tokens * rate_write
        + usage.cache_read_input_tokens * rate_read
    )
    return (total / _MILLION).quantize(_QUANTUM)
