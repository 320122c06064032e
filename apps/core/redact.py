"""Redaction of secrets before anything is persisted (SPEC 8, "Redaction").

Every store that keeps text a model, a tool or a caller produced (run events,
transcript rows, tool-call records, steering input, gateway audit rows)
passes it through a `Redactor` in the one place that builds its rows, so no
writer can go around it. Two tiers:

- Tier A, exact values: the runtime's own secrets (Django's secret key, the
  token pepper, and every environment variable whose name marks it secret:
  `*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*CREDENTIAL*`, `*AUTH*`, plus
  the infrastructure names of apps.core.secrets) and the run's own
  credentials (`user_bearer`, `user_credentials`). Each exact occurrence
  becomes `[redacted:NAME]`. Values shorter than MIN_SECRET_LEN are skipped:
  masking a short value ("true", a port) would mask ordinary text.
- Tier B, patterns: secrets the runtime never held (`Authorization: Bearer X`,
  `sk-...`, `AKIA...`, `xox?-...`, `ghp_...`, `password=...`). Each value
  class excludes quotes, commas, `;`, `&`, braces, brackets and backslashes, so a match
  never leaves a string or eats a Tier A marker.

JSON values are redacted leaf by leaf (strings only, keys kept), so the
result is always the same structure. Run credentials are always masked;
`LOOMCYCLE_REDACT_SECRETS=0` turns off only the env-secret and pattern tiers.

Cost: the patterns are compiled once; a string is scanned by a regex only
after a cheap substring test says some pattern or value could match, so text
without a candidate costs a few `in` scans (docs/tools.md gives measurements).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.core.secrets import INFRA_SECRET_NAMES

MIN_SECRET_LEN = 8
# Environment variable names that mark a secret (upper-cased substring).
SECRET_NAME_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")

_VALUE = r"[^\s\"',;&}\[\]\\]+"  # never crosses a string boundary, a marker or a query separator
_KEY_NAMES = r"(?:api[_-]?key|secret(?:[_-]?key)?|token|password|passwd)"  # `access_token=`, `OPENAI_API_KEY=`


@dataclass(frozen=True)
class _Rule:
    """A Tier B pattern, run only when one of its `triggers` occurs in the text
    (lower-cased first when `fold`): most text skips most rules."""

    pattern: re.Pattern[str]
    repl: str
    triggers: tuple[str, ...]
    fold: bool = False


# Replacements keep the key or scheme and drop the value.
_RULES = (
    _Rule(
        re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(?:token|bearer)\s+)" + _VALUE),
        r"\1[redacted]",
        ("authorization",),
        fold=True,
    ),
    _Rule(re.compile(r"\bsk-[A-Za-z0-9][A-Za-z0-9_-]{15,}"), "[redacted:api-key]", ("sk-",)),
    _Rule(re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "[redacted:aws-key]", ("AKIA",)),
    _Rule(re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}"), "[redacted:slack-token]", ("xox",)),
    _Rule(re.compile(r"\bghp_[A-Za-z0-9]{36,}"), "[redacted:github-token]", ("ghp_",)),
    # Not after a letter (`mytoken=` is not a key; `access_token=`, `OPENAI_API_KEY=` are).
    _Rule(
        re.compile(r"(?i)(?<![a-z])(" + _KEY_NAMES + r"\b\s*[:=]\s*['\"]?)" + _VALUE),
        r"\1[redacted]",
        ("api", "secret", "token", "passw"),
        fold=True,
    ),
)


class Redactor:
    """Masks the exact `values` ({name: value}) and, if `patterns`, Tier B.
    Immutable; `with_values` gives a redactor for one run."""

    def __init__(self, values: Mapping[str, str], *, patterns: bool, min_len: int = MIN_SECRET_LEN) -> None:
        kept = {v: n for n, v in values.items() if len(v) >= min_len}
        self._values: dict[str, str] = kept  # value -> name
        self._min_len = min_len
        self.patterns = patterns
        # Longest first: a value inside a longer one is masked as part of the longer match.
        ordered = sorted(kept, key=len, reverse=True)
        self._exact = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    def with_values(self, values: Mapping[str, str]) -> Redactor:
        """This redactor plus `values` (a run's credentials, {name: value})."""
        if not values:
            return self
        merged = {name: value for value, name in self._values.items()}
        merged.update(values)
        return Redactor(merged, patterns=self.patterns, min_len=self._min_len)

    def text(self, s: str) -> str:
        """`s` with every known secret value and secret pattern masked."""
        if self._exact is not None and any(v in s for v in self._values):
            s = self._exact.sub(lambda m: f"[redacted:{self._values[m.group(0)]}]", s)
        if self.patterns:
            lower = s.lower()  # for the folded triggers; a stale copy after a substitution only over-triggers
            for rule in _RULES:
                if any(t in (lower if rule.fold else s) for t in rule.triggers):
                    s = rule.pattern.sub(rule.repl, s)
        return s

    def value(self, v: Any) -> Any:
        """A JSON value with its string leaves redacted (a new value; keys kept)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v


def is_secret_env_name(name: str) -> bool:
    upper = name.upper()
    return upper in INFRA_SECRET_NAMES or any(m in upper for m in SECRET_NAME_MARKERS)


def runtime_secret_values() -> dict[str, str]:
    """{name: value} of the runtime's own secrets: secret-named environment
    variables and the instance secrets settings hold (which may come from the
    data directory's secrets file rather than the environment)."""
    values = {n: v for n, v in os.environ.items() if v and is_secret_env_name(n)}
    values["DJANGO_SECRET_KEY"] = str(settings.SECRET_KEY)
    if settings.LOOMCYCLE.operator_token_pepper:
        values["LOOMCYCLE_OPERATOR_TOKEN_PEPPER"] = settings.LOOMCYCLE.operator_token_pepper
    for name, key in settings.LOOMCYCLE.provider_keys.items():
        if key:
            values[name] = key
    return values


@functools.cache
def runtime_redactor() -> Redactor:
    """The process's redactor (built once): Tier A of the runtime's secrets and
    Tier B, or nothing when LOOMCYCLE_REDACT_SECRETS=0."""
    if not settings.LOOMCYCLE.redact_secrets:
        return Redactor({}, patterns=False)
    return Redactor(runtime_secret_values(), patterns=True)


def run_redactor(credentials: Mapping[str, str]) -> Redactor:
    """The redactor of one run: the runtime's plus the run's credentials
    (always masked, whatever LOOMCYCLE_REDACT_SECRETS says)."""
    return runtime_redactor().with_values(credentials)
