"""Provider drivers. `get_provider(id)` is the one entry point the engine uses."""

from apps.gateway.providers.base import (
    PURPOSE_COMPACTION,
    Capabilities,
    Done,
    Provider,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from apps.gateway.providers.registry import get_provider, has_provider, provider_ids

__all__ = [
    "PURPOSE_COMPACTION",
    "Capabilities",
    "Done",
    "Provider",
    "ProviderCancelled",
    "ProviderError",
    "ProviderEvent",
    "ProviderRequest",
    "TextDelta",
    "ThinkingDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "get_provider",
    "has_provider",
    "provider_ids",
]
