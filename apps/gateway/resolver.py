"""Model routing (SPEC 7.3, 7.4): a request or an agent -> ordered candidates
(provider, model) plus the fallback policy that walks them.

Inputs, from the yaml (`apps.core.config.runtime_config()`):
- `models: {alias: {provider, model}}`;
- `tiers: {tier: [candidate | alias]}` (the library's candidates);
- `provider_priority: [provider...]`;
- `user_tiers: {name: {provider_priority, tiers, fallback_on_error,
  max_fallback_attempts, retry_attempts}}` (must include `default`);
- `defaults: {provider, model}` (the pin of an agent or request that names none).

An agent pins `provider` + `model` XOR names a `tier`. Tier path: the
candidate list is the agent's `models[tier]`, else the user tier's
`tiers[tier]`, else the library's `tiers[tier]`; the provider order is the
agent's `providers` intersected with the user tier's `provider_priority`
(agent order; empty intersection -> 403), else the agent's `providers`, else
the user tier's priority, else the library's; a candidate whose provider is
not in a non-empty order, or not configured here (no key), is skipped.
Nothing left -> 503 `tier_unavailable`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from apps.core.config import runtime_config
from apps.core.errors import ApplicationError, Forbidden, Invalid
from apps.gateway.providers.registry import get_provider, has_provider, provider_ids

TIERS = ("low", "middle", "high")
EFFORTS = ("", "low", "medium", "high")
DEFAULT_MAX_FALLBACK_ATTEMPTS = 3
DEFAULT_RETRY_ATTEMPTS = 3
MAX_RETRY_ATTEMPTS = 5


class Unavailable(ApplicationError):
    status, code = 503, "tier_unavailable"


@dataclass(frozen=True)
class Candidate:
    provider: str
    model: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Policy:
    fallback_on_error: bool = True
    max_fallback_attempts: int = DEFAULT_MAX_FALLBACK_ATTEMPTS
    retry_attempts: int = DEFAULT_RETRY_ATTEMPTS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Route:
    candidates: tuple[Candidate, ...]
    policy: Policy
    user_tier: str
    tier: str = ""  # "" for a pin


def _config() -> dict[str, Any]:
    return runtime_config()


def _aliases(config: dict[str, Any]) -> dict[str, Any]:
    models = config.get("models") or {}
    if not isinstance(models, dict):
        raise Invalid("models: must be a mapping of alias -> {provider, model}", code="config_invalid")
    return models


def _candidate(raw: Any, aliases: dict[str, Any], where: str) -> Candidate:
    """{provider, model} | alias | "provider/model"."""
    if isinstance(raw, str):
        if raw in aliases:
            return _candidate(aliases[raw], {}, f"models.{raw}")
        provider, sep, model = raw.partition("/")
        if sep and provider and model:
            return Candidate(provider, model)
        raise Invalid(f'{where}: "{raw}" is neither an alias in models: nor "provider/model"', code="bad_request")
    if isinstance(raw, dict) and isinstance(raw.get("provider"), str) and isinstance(raw.get("model"), str):
        return Candidate(raw["provider"], raw["model"])
    raise Invalid(f"{where}: a candidate is {{provider, model}} or an alias", code="bad_request")


def user_tier_block(name: str | None, config: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(name, block): omitted -> `default`; unknown while `user_tiers:` exists -> 400."""
    config = _config() if config is None else config
    tiers = config.get("user_tiers") or {}
    if not tiers:
        return name or "default", {}
    chosen = name or "default"
    block = tiers.get(chosen)
    if not isinstance(block, dict):
        raise Invalid(
            f'unknown user_tier "{chosen}" (configured: {", ".join(sorted(tiers))})',
            code="unknown_user_tier",
        )
    return chosen, block


def policy_for(block: dict[str, Any]) -> Policy:
    def count(key: str, default: int, cap: int | None = None) -> int:
        value = block.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise Invalid(f"user_tiers: {key} must be a non-negative integer", code="config_invalid")
        return min(value, cap) if cap is not None else value

    return Policy(
        fallback_on_error=bool(block.get("fallback_on_error", True)),
        max_fallback_attempts=count("max_fallback_attempts", DEFAULT_MAX_FALLBACK_ATTEMPTS),
        retry_attempts=count("retry_attempts", DEFAULT_RETRY_ATTEMPTS, MAX_RETRY_ATTEMPTS),
    )


def _order(agent: dict[str, Any], block: dict[str, Any], config: dict[str, Any]) -> list[str] | None:
    agent_order = list(agent.get("providers") or [])
    tier_order = list(block.get("provider_priority") or [])
    if agent_order and tier_order:
        both = [p for p in agent_order if p in tier_order]
        if not both:
            raise Forbidden(
                f"none of the agent's providers {agent_order} is allowed for this user tier ({tier_order})",
                code="tier_agent_not_available",
            )
        return both
    return agent_order or tier_order or list(config.get("provider_priority") or []) or None


def _tier_candidates(tier: str, agent: dict[str, Any], block: dict[str, Any], config: dict[str, Any]) -> list[Any]:
    for source in (agent.get("models"), block.get("tiers"), config.get("tiers")):
        if isinstance(source, dict) and source.get(tier):
            found = source[tier]
            return list(found) if isinstance(found, list) else [found]
    return []


def resolve_route(
    *,
    provider: str | None = None,
    model: str | None = None,
    tier: str | None = None,
    user_tier: str | None = None,
    agent: dict[str, Any] | None = None,
) -> Route:
    """Candidates in walk order and the fallback policy. A request's own
    provider/model/tier wins over the agent's; with none at all, the model may
    be an alias or "provider/model", else `defaults:` applies."""
    config = _config()
    agent = agent or {}
    tier_name, block = user_tier_block(user_tier, config)
    policy = _agent_retries(policy_for(block), agent)
    aliases = _aliases(config)
    tier = tier or (None if (provider or model) else agent.get("tier")) or None
    if tier:
        if tier not in TIERS:
            raise Invalid(f'unknown tier "{tier}" (one of {", ".join(TIERS)})', code="bad_request")
        raw = _tier_candidates(tier, agent, block, config)
        order = _order(agent, block, config)
        candidates = [_candidate(c, aliases, f"tier {tier}") for c in raw]
        if order is not None:
            candidates = sorted((c for c in candidates if c.provider in order), key=lambda c: order.index(c.provider))
        usable = [c for c in candidates if has_provider(c.provider)]
        if not usable:
            raise Unavailable(
                f'tier "{tier}": no candidate is usable here (candidates: '
                f"{', '.join(f'{c.provider}/{c.model}' for c in candidates) or 'none'}; "
                f"configured providers: {', '.join(provider_ids()) or 'none'})"
            )
        return Route(_checked(usable), policy, tier_name, tier)
    pin = _pin(provider, model, agent, aliases, config)
    if not has_provider(pin.provider):
        raise Invalid(
            f'unknown provider "{pin.provider}" (available: {", ".join(provider_ids()) or "none"})',
            code="unknown_provider",
        )
    return Route(_checked([pin]), policy, tier_name)


def _agent_retries(policy: Policy, agent: dict[str, Any]) -> Policy:
    """The agent's `retry_attempts`, when set, wins over its user tier's (0 = no same-provider
    retry even under a generous tier, loomcycle's rule), capped like the tier's."""
    own = agent.get("retry_attempts")
    if not isinstance(own, int) or isinstance(own, bool) or own < 0:
        return policy
    return replace(policy, retry_attempts=min(own, MAX_RETRY_ATTEMPTS))


def _checked(candidates: list[Candidate]) -> tuple[Candidate, ...]:
    """Each candidate's model as its provider accepts it (400 before any call)."""
    for c in candidates:
        try:
            get_provider(c.provider).check_model(c.model)
        except ValueError as exc:
            raise Invalid(f"{c.provider}/{c.model[:80]}: {exc}", code="invalid_model_options") from exc
    return tuple(candidates)


def _pin(
    provider: str | None, model: str | None, agent: dict[str, Any], aliases: dict[str, Any], config: dict[str, Any]
) -> Candidate:
    if provider and model:
        return Candidate(provider, model)
    if model and not provider:
        if model in aliases:
            return _candidate(aliases[model], {}, f"models.{model}")
        head, sep, rest = model.partition("/")
        if sep and has_provider(head):
            return Candidate(head, rest)
    if not provider and not model and agent.get("provider") and agent.get("model"):
        return Candidate(str(agent["provider"]), str(agent["model"]))
    defaults = config.get("defaults") or {}
    provider = provider or defaults.get("provider")
    model = model or defaults.get("model")
    if not provider or not model:
        raise Invalid(
            "no model to call: give provider and model, a tier, an alias from models:, "
            'or "provider/model" (or set defaults: in the yaml)',
            code="bad_request",
        )
    return Candidate(str(provider), str(model))


def validate_agent_routing(name: str, definition: dict[str, Any]) -> str | None:
    """Config-load checks of SPEC appendix D; the error text, or None when valid."""
    pin = [k for k in ("provider", "model") if definition.get(k)]
    tier = definition.get("tier")
    if tier and pin:
        return f"agent {name!r}: pin provider+model XOR name a tier, not both"
    if len(pin) == 1:
        return f"agent {name!r}: a pin needs both provider and model (only {pin[0]} is set)"
    if not tier and not pin:
        return f"agent {name!r}: provider and model (a pin), or a tier, is required"
    if tier and tier not in TIERS:
        return f"agent {name!r}: tier must be one of {', '.join(TIERS)}"
    effort = definition.get("effort", "")
    if effort not in EFFORTS:
        return f"agent {name!r}: effort must be low, medium or high"
    models = definition.get("models")
    if models is not None:
        if not isinstance(models, dict) or any(k not in TIERS for k in models):
            return f"agent {name!r}: models is a map of tier -> [{{provider, model}}]"
        for key, cands in models.items():
            items = cands if isinstance(cands, list) else [cands]
            for c in items:
                if not (isinstance(c, dict) and isinstance(c.get("provider"), str) and isinstance(c.get("model"), str)):
                    return f"agent {name!r}: models.{key} entries are {{provider, model}}"
    providers = definition.get("providers")
    if providers is not None and not (isinstance(providers, list) and all(isinstance(p, str) for p in providers)):
        return f"agent {name!r}: providers must be a list of provider ids"
    return _pinned_model_error(name, definition)


def _pinned_model_error(name: str, definition: dict[str, Any]) -> str | None:
    provider, model = definition.get("provider"), definition.get("model")
    if not (isinstance(provider, str) and isinstance(model, str) and has_provider(provider)):
        return None  # an unknown provider is reported when the agent is resolved
    try:
        get_provider(provider).check_model(model)
    except ValueError as exc:
        return f"agent {name!r}: {exc}"
    return None


def resolve(
    *,
    provider: str | None = None,
    model: str | None = None,
    tier: str | None = None,
    user_tier: str | None = None,
    agent: dict[str, Any] | None = None,
) -> list[Candidate]:
    """The candidates alone (the gateway calls the first: it never falls back, SPEC 7.4)."""
    return list(resolve_route(provider=provider, model=model, tier=tier, user_tier=user_tier, agent=agent).candidates)
