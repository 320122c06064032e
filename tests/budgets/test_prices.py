"""The price table is data the operator can override in yaml (issue 37): a
`prices:` entry replaces or adds a model's price per token kind; a model with no
price anywhere stays unpriced (None), never 0; a bad entry is a config error."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.core.errors import Invalid
from apps.gateway.pricing import cost_usd, price_for
from apps.gateway.providers import Usage

CALL = Usage(input_tokens=1_000_000, output_tokens=1_000_000, provider="openai", model="gpt-4o")


def use_yaml(settings: Any, tmp_path: Path, text: str) -> None:
    path = tmp_path / f"prices-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(text)
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(path),))


def test_a_yaml_price_overrides_the_built_in_one_and_prices_an_unknown_model(settings: Any, tmp_path: Path) -> None:
    assert cost_usd("openai", "gpt-4o", CALL) == Decimal("12.500000")  # the built-in list price
    assert price_for("acme-llm", "house-1") is None  # unpriced, not free
    use_yaml(
        settings,
        tmp_path,
        "prices:\n  openai:\n    gpt-4o: {input: 1, output: 2, currency: USD}\n"
        "  acme-llm:\n    house-1: {input: 0.5, output: 0.5, cache_read: 0.1}\n",
    )
    assert cost_usd("openai", "gpt-4o", CALL) == Decimal("3.000000")
    house = Usage(input_tokens=2_000_000, output_tokens=0, provider="acme-llm", model="house-1")
    assert cost_usd("acme-llm", "house-1", house) == Decimal("1.000000")
    assert price_for("acme-llm", "house-2") is None


@pytest.mark.parametrize(
    "entry", ["{input: 1, currency: EUR}", "{input: lots}", "{inputs: 1}"], ids=["currency", "number", "kind"]
)
def test_a_bad_price_entry_is_a_config_error(settings: Any, tmp_path: Path, entry: str) -> None:
    use_yaml(settings, tmp_path, f"prices:\n  openai:\n    gpt-4o: {entry}\n")
    with pytest.raises(Invalid) as bad:
        price_for("openai", "gpt-4o")
    assert bad.value.code == "config_invalid"
