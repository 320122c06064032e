"""Channels: the tenant's channels, one channel's messages browsed from a cursor, and publish.
The rules are REST's (apps.channels.access: which stream an admin route reaches; verbs and
selectors: the list, the non-committing peek, publish), so an unknown or another tenant's
channel is the same 404 as over GET /v1/_channels/{name}/peek."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.channels import access, selectors, verbs
from apps.channels.streams import check_cursor
from apps.console.pages import console_view, render_page
from apps.core.types import Principal

PAGE = 20


class PayloadField(forms.JSONField):
    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)  # an empty box, not "null"


class PublishForm(forms.Form):
    payload = PayloadField(label="Payload (any JSON value but null)", widget=forms.Textarea({"rows": 4}))
    ttl = forms.IntegerField(label="TTL in seconds (empty: the channel's default)", min_value=0, required=False)


@console_view(rest="GET /v1/_channels")
def channels(request: HttpRequest, principal: Principal) -> HttpResponse:
    rows = verbs.channel_list(principal)
    return render_page(request, principal, "console/channels/list.html", {"rows": rows})


@console_view(rest="* /v1/_channels/{name}/publish")
def channel(request: HttpRequest, principal: Principal, name: str) -> HttpResponse:
    """GET: the messages after `from_cursor` (from the oldest without one); POST: publish,
    recorded as the operator's publish (REST's admin route)."""
    target = access.admin_stream(principal, name)
    form = PublishForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if form.cleaned_data["payload"] is None:
            form.add_error("payload", "a payload is required (any JSON value but null)")
        else:
            d = form.cleaned_data
            out = verbs.publish(target, value=d["payload"], ttl=d["ttl"], deliver_at=None, by_user=access.ADMIN)
            messages.success(request, f"published {out['msg_id']}")
            return redirect(request.get_full_path())
    from_cursor = check_cursor(request.GET.get("from_cursor") or None)
    read = selectors.peek(stream=target[0], from_cursor=from_cursor, max_messages=PAGE)
    ctx = {
        "name": name,
        "declared": verbs.described(target[1], principal.tenant_id),
        "rows": list(zip(read.messages, read.cursors, strict=True)),
        "from_cursor": from_cursor or "",
        "next_cursor": read.next_cursor if len(read.messages) == PAGE else "",
        "form": form,
    }
    return render_page(request, principal, "console/channels/channel.html", ctx, status=400 if form.errors else 200)
