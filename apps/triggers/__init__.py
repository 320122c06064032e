"""Triggers: schedules fired by beat, inbound webhooks and tool-use hooks.

ScheduleDef and WebhookDef themselves stay in apps/substrate; this app owns
what happens when they fire (fire rows, deliveries, hook registrations).
"""
