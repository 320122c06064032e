"""The admin-plane kinds (MCPServerDef, ScheduleDef, WebhookDef): never agent-callable (SPEC 6.5)."""

from __future__ import annotations
