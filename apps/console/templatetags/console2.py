"""Template filters of console2's pages."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """A stored JSON value as indented text (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
