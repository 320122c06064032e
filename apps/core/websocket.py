"""WebSocket origin check against cross-site WebSocket hijacking.

Browsers always send `Origin` on a WebSocket handshake, so a page from another
site is refused when its origin is not one of ALLOWED_HOSTS. A client that
sends no Origin at all is not a browser page; it gets through to the bearer
check like any API client (Channels' own validator would refuse it too).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult

from channels.security.websocket import OriginValidator
from django.conf import settings


class BrowserOriginValidator(OriginValidator):
    def valid_origin(self, parsed_origin: ParseResult | None) -> bool:
        if parsed_origin is None:
            return True
        return bool(self.validate_origin(parsed_origin))


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    return BrowserOriginValidator(application, settings.ALLOWED_HOSTS)
