"""Whether a provider's model takes image input: the capability data behind the
up-front refusal of an image sent to a model that cannot see it (SPEC 7.1).

The driver's default (`Capabilities.vision`: anthropic, openai, gemini and the
mock yes, ollama no) is refined per model as loomcycle refines it: the text-only
Claude families (claude-2, claude-instant), OpenAI's gpt-3.5 and the original
gpt-4 snapshots, and every model of the `deepseek` dialect have none. An
endpoint's yaml `capabilities: {vision: …}` is the operator's word and wins
over both (an Ollama llava endpoint, a compat server without vision).
"""

from __future__ import annotations

from apps.core.errors import Invalid
from apps.gateway.providers import get_provider
from apps.gateway.providers.http import HttpProvider

# The exact original gpt-4 snapshots (gpt-4-turbo and later see images): matched whole, not as prefixes.
_OPENAI_TEXT_ONLY = frozenset({"gpt-4", "gpt-4-0314", "gpt-4-0613", "gpt-4-32k", "gpt-4-32k-0314", "gpt-4-32k-0613"})


def _model_sees(driver: str, dialect: str, model: str) -> bool:
    name = model.lower()
    if driver == "anthropic":
        return "claude-2" not in name and "claude-instant" not in name
    if driver == "openai":
        if dialect == "deepseek":
            return False
        return not name.startswith("gpt-3.5") and name not in _OPENAI_TEXT_ONLY
    return True


def has_vision(provider_id: str, model: str) -> bool:
    provider = get_provider(provider_id)
    if not isinstance(provider, HttpProvider):
        return provider.capabilities.vision
    declared = provider.config.capabilities.get("vision")
    if declared is not None:
        return bool(declared)
    return provider.capabilities.vision and _model_sees(provider.config.driver, provider.config.dialect, model)


def require_vision(provider_id: str, model: str) -> None:
    """400 `model_lacks_vision` unless the model takes images."""
    if not has_vision(provider_id, model):
        raise Invalid(
            f"the request carries an image but model {provider_id}/{model} has no vision "
            "(choose a vision model, or declare `capabilities: {vision: true}` on the provider)",
            code="model_lacks_vision",
            details={"provider": provider_id, "model": model},
        )
