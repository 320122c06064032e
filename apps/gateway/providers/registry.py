"""Which providers this process can call. The providers issue adds the real drivers here."""

from __future__ import annotations

from functools import cache

from apps.core.errors import Invalid
from apps.gateway.providers.base import Provider
from apps.gateway.providers.mock import MockProvider
from loomcycle_project import env as E


@cache
def _providers() -> dict[str, Provider]:
    found: dict[str, Provider] = {}
    if E.MOCK_ENABLED:
        found["mock"] = MockProvider("mock")
        found["mock-stable"] = MockProvider("mock-stable", stable=True)
    return found


def provider_ids() -> list[str]:
    return sorted(_providers())


def get_provider(provider_id: str) -> Provider:
    try:
        return _providers()[provider_id]
    except KeyError:
        raise Invalid(
            f'unknown provider "{provider_id}" (available: {", ".join(provider_ids()) or "none"})',
            code="unknown_provider",
        ) from None
