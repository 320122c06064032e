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
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.core.secrets import INFRA_SECRET_NAMES

MIN_SECRET_LEN = 8
# `_`-separated environment variable name tokens (upper-cased) that mark a secret.
SECRET_NAME_TOKENS = frozenset(
    {
        "KEY",
        "APIKEY",
        "ACCESSKEY",
        "PRIVATEKEY",
        "SECRETKEY",
        "TOKEN",
        "AUTHTOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "CREDENTIALS",
    }
)
# A value that is a filesystem path (`/x`, `~/x`, `./x`, `C:\x`) names where a secret is, not the secret.
_PATH_VALUE = re.compile(r"(?:/|~/|\.{1,2}/|[A-Za-z]:[\\/])\S*")

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
        self._init({v: n for n, v in values.items()}, patterns=patterns, min_len=min_len)

    def _init(self, by_value: Mapping[str, str], *, patterns: bool, min_len: int) -> None:
        self._own = {v: n for v, n in by_value.items() if len(v) >= min_len}  # value -> name, as given
        self._min_len = min_len
        self.patterns = patterns
        self._values: dict[str, str] = {}  # every masked form -> name
        for value, name in self._own.items():
            for form in escaped_forms(value):
                self._values.setdefault(form, name)
        # Longest first: a value inside a longer one is masked as part of the longer match.
        ordered = sorted(self._values, key=len, reverse=True)
        self._exact = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    def with_values(self, values: Mapping[str, str]) -> Redactor:
        """This redactor plus `values` (a run's credentials, {name: value}).
        Keyed by value: a credential named like a runtime secret adds its own
        value and never removes the runtime one."""
        if not values:
            return self
        merged = dict(self._own)
        for name, value in values.items():
            merged[value] = name
        out = Redactor.__new__(Redactor)
        out._init(merged, patterns=self.patterns, min_len=self._min_len)
        return out

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

    def forms(self) -> tuple[str, ...]:
        """Every exact value form Tier A masks: for a caller that must not cut text inside one
        (apps.runs.livetokens holds back a live delta that could end in a value's prefix)."""
        return tuple(self._values)

    def value(self, v: Any) -> Any:
        """A JSON value with its string leaves redacted (a new value; keys kept)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v


def escaped_forms(value: str) -> list[str]:
    """`value` and the distinct forms an error message may quote it in: JSON
    escaped (ASCII and not), Python repr escaped (str and UTF-8 bytes)."""
    forms = [
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        repr(value.encode("utf-8", "backslashreplace"))[2:-1],
    ]
    return list(dict.fromkeys(forms))


def is_secret_env_name(name: str) -> bool:
    """An infrastructure secret name, or one with a SECRET_NAME_TOKENS token."""
    upper = name.upper()
    return upper in INFRA_SECRET_NAMES or any(t in SECRET_NAME_TOKENS for t in upper.split("_"))


def _is_secret_env(name: str, value: str) -> bool:
    if not value:
        return False
    if name.upper() in INFRA_SECRET_NAMES:
        return True
    return is_secret_env_name(name) and not _PATH_VALUE.fullmatch(value)


def runtime_secret_values() -> dict[str, str]:
    """{name: value} of the runtime's own secrets: secret-named environment
    variables (a path value skipped, but for the infrastructure names) and the
    instance secrets settings hold (which may come from the data directory's
    secrets file rather than the environment)."""
    values = {n: v for n, v in os.environ.items() if _is_secret_env(n, v)}
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
