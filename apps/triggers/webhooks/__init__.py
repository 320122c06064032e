"""Inbound webhooks (SPEC 2.10, 9.2): the receiver behind a WebhookDef.

WebhookDef rows live in apps.substrate (validated there); this package owns
what a delivery does: verify, dedupe, map, rate-limit, spawn or publish, and
the durable record of every delivery with its verdict.
"""
