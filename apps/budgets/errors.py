"""The budgets app's error codes."""

from __future__ import annotations

from apps.core.errors import Forbidden, Invalid


class InvalidLimit(Invalid):
    code = "invalid_limit"


class LimitForbidden(Forbidden):
    code = "limit_forbidden"
