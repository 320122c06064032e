"""Django admin for the substrate.

Version rows are immutable, so their change page is view-only; every write
(create, fork, promote, retire) goes through `services.def_dispatch` with an
admin `Author` and obeys the same rules as REST and the agent tools. Tokens
are minted, rotated and revoked only through `tokens`; their hash is never
shown and their plaintext only once. A refusal comes back as a form error or
a message, never a 500.
"""

from __future__ import annotations

from apps.substrate.admin import channels, defs, tokens
from apps.substrate.admin.common import admin_author, change_url

__all__ = ["admin_author", "change_url", "channels", "defs", "tokens"]
