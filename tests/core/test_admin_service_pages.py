"""Admin pages over rows the services own: memory keys, snapshots and tool-use hooks are read-only
in the admin (no add, no edit form, no bulk delete past the service), and their actions call the
service, so its checks and side effects (the hooks' chain cache) hold."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.memory.models import MemoryEntry
from apps.memory.services import Slot, memory_set
from apps.snapshots.models import Snapshot
from apps.triggers.hooks.models import HookRegistration

pytestmark = pytest.mark.django_db

SLOT = Slot(tenant_id="acme", scope="tenant", scope_id="")


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _action(client: Client, model: str, action: str, ids: list[str]) -> None:
    url = reverse(f"admin:{model}_changelist")
    resp = client.post(url, {"action": action, "_selected_action": ids}, follow=True)
    assert resp.status_code == 200, resp.content[:500]


def test_memory_rows_are_read_only_and_deleted_through_the_service(admin_client: Client) -> None:
    memory_set(slot=SLOT, key="plan", value={"step": 1})
    row = MemoryEntry.objects.get(tenant_id="acme", key="plan")
    change = reverse("admin:memory_memoryentry_change", args=[quote(str(row.pk))])
    assert admin_client.get(change).status_code == 200  # readable
    edit = admin_client.post(change, {"tenant_id": "acme", "scope": "tenant", "key": "plan", "value": '"x" * 10**9'})
    assert edit.status_code == 403 and MemoryEntry.objects.get(pk=row.pk).value == {"step": 1}
    assert admin_client.get(reverse("admin:memory_memoryentry_add")).status_code == 403
    listing = admin_client.get(reverse("admin:memory_memoryentry_changelist"))
    assert set(listing.context["action_form"].fields["action"].choices) >= {
        ("delete_keys", "Delete the selected keys (memory service)"),
        ("reembed_keys", "Re-embed the selected keys (memory service)"),
    }
    assert "delete_selected" not in dict(listing.context["action_form"].fields["action"].choices)
    _action(admin_client, "memory_memoryentry", "delete_keys", [str(row.pk)])
    assert not MemoryEntry.objects.filter(pk=row.pk).exists()


def test_reembedding_keeps_the_value_and_the_expiry(admin_client: Client) -> None:
    memory_set(slot=SLOT, key="soon", value="text", ttl_seconds=3600)
    row = MemoryEntry.objects.get(tenant_id="acme", key="soon")
    _action(admin_client, "memory_memoryentry", "reembed_keys", [str(row.pk)])
    again = MemoryEntry.objects.get(pk=row.pk)
    assert again.value == "text" and again.expires_at is not None
    assert abs((again.expires_at - row.expires_at).total_seconds()) < 5  # type: ignore[operator]


def test_snapshot_and_hook_pages_list_and_delete_through_their_services(admin_client: Client) -> None:
    snap = Snapshot.objects.create(
        id="snap_1_00000000",
        created_at=timezone.now(),
        label="before",
        schema_version="1",
        byte_size=2,
        checksum="sha256:0",
        content="{}",
    )
    hook = HookRegistration.objects.create(
        hook_id="hook_0000000000000001",
        tenant_id="acme",
        owner="ops",
        name="audit",
        phase="pre",
        agents=["*"],
        tools=["*"],
        callback_url="http://127.0.0.1:9/hook",
        timeout_ms=1000,
    )
    for model in ("snapshots_snapshot", "triggers_hookregistration"):
        assert admin_client.get(reverse(f"admin:{model}_changelist")).status_code == 200
        assert admin_client.get(reverse(f"admin:{model}_add")).status_code == 403
    page = admin_client.get(reverse("admin:snapshots_snapshot_change", args=[quote(snap.id)]))
    assert page.status_code == 200 and b"before" in page.content
    _action(admin_client, "snapshots_snapshot", "delete_snapshots", [snap.id])
    assert not Snapshot.objects.filter(id=snap.id).exists()
    _action(admin_client, "triggers_hookregistration", "delete_hooks", [str(hook.pk)])
    assert not HookRegistration.objects.filter(pk=hook.pk).exists()
