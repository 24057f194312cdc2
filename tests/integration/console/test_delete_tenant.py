"""Delete tenant: after it, nothing of the tenant remains on disk or in any row that names it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from tests.integration.api.conftest import wait_finished
from tests.integration.console.conftest import run_action, staff_client


def _rows_naming(needles: list[str]) -> dict[str, int]:
    """Every table's rows whose text (all columns) contains one of ``needles``."""
    found = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            for needle in needles:
                cursor.execute(f'SELECT count(*) FROM "{table}" t WHERE t::text ILIKE %s', [f"%{needle}%"])
                n = cursor.fetchone()[0]
                if n:
                    found[f"{table} ~ {needle}"] = n
    return found


def _tenant_with_everything(live_tenant: Any) -> tuple[Any, User, Any]:
    """A tenant with a member (and the member's key), a finished job with audio, an uploaded voice prompt."""
    from webapp.speech.models import Voice
    from webapp.tenants.models import Membership
    from webapp.tenants.services import OPERATOR, create_api_key

    tenant = live_tenant()
    member = User.objects.create_user("zz-member-of-one", "zz-member@example.test", "pw-member-123")
    Membership.objects.create(user=member, organization=tenant.org, role="owner")
    create_api_key(tenant.org, "member key", created_by=OPERATOR, user=member)
    job = tenant.client.post("/api/v1/speech", {"text": "Everything of this tenant must go."}).json()
    assert wait_finished(tenant.client, job["id"])["status"] == "succeeded"
    prompt = f"voices/{tenant.org.pk}/prompt.wav"
    Path(settings.MEDIA_ROOT, prompt).parent.mkdir(parents=True, exist_ok=True)
    Path(settings.MEDIA_ROOT, prompt).write_bytes(b"RIFF" + bytes(64))
    Voice.objects.create(
        voice_id=f"zz-voice-{tenant.org.pk.hex[:8]}",
        organization=tenant.org,
        name="Their own voice",
        engine="piper",
        language="en",
        sample_rate=22050,
        prompt_path=prompt,
        prompt_bytes=68,
        embedding=[0.5] * 256,
        cloning_mode="approximate",
    )
    return tenant, member, job


def test_delete_tenant_asks_first_then_leaves_nothing(live_tenant: Any) -> None:
    from webapp.audit.models import AuditEvent
    from webapp.speech.models import RetiredUsage

    tenant, member, job = _tenant_with_everything(live_tenant)
    other = live_tenant()  # a bystander: untouched
    org = tenant.org
    needles = [str(org.pk), org.slug, org.name, tenant.key.prefix, member.username, job["id"]]
    client, staff = staff_client()
    # An admin edit of the tenant leaves traces (the admin's history, an audit event) that must go too.
    change = client.post(
        f"/admin/tenants/organization/{org.pk}/change/",
        {
            "name": org.name,
            "slug": org.slug,
            "plan": org.plan_id,
            "is_active": "on",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )
    assert change.status_code == 302, change.content[:2000]
    assert _rows_naming([str(org.pk)])

    ask = run_action(client, "tenants/organization", "delete_tenants", [org.pk])
    assert ask.status_code == 200 and b"cannot be undone" in ask.content
    assert _rows_naming([str(org.pk)]), "asking must delete nothing"

    done = run_action(client, "tenants/organization", "delete_tenants", [org.pk], confirm="yes")
    assert done.status_code == 302
    assert _rows_naming(needles) == {}
    for folder in ("audio", "voices"):
        assert not os.path.exists(os.path.join(settings.MEDIA_ROOT, folder, str(org.pk)))
    assert not User.objects.filter(username=member.username).exists()
    assert User.objects.filter(pk=staff.pk).exists()
    # The ledger keeps the month's total, naming no one.
    retired = RetiredUsage.objects.get(plan=org.plan.slug)
    assert (retired.tenants, retired.characters_used, retired.jobs) == (
        1,
        len("Everything of this tenant must go."),
        1,
    )
    event = AuditEvent.objects.get(action="tenant.deleted")
    assert event.actor_id == staff.pk and event.details["synthesisjob"] == 1 and event.details["apikey"] == 2
    # The bystander still works.
    assert other.client.get("/api/v1/voices").status_code == 200


def test_the_stock_delete_is_not_offered(live_tenant: Any) -> None:
    tenant = live_tenant()
    client, _ = staff_client()
    assert client.get(f"/admin/tenants/organization/{tenant.org.pk}/delete/").status_code == 403
    page = client.get("/admin/tenants/organization/").content.decode()
    assert "delete_tenants" in page and "delete_selected" not in page
