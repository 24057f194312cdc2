"""Plans show their effect before saving; the audit log records admin writes and is pruned."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from tests.integration.console.conftest import STAFF_IP, staff_client


def _plan_form(plan: Any, **changes: Any) -> dict[str, Any]:
    """The change form's fields as the browser would post them (an unchecked box is left out)."""
    from django.forms.models import model_to_dict

    data = {name: value for name, value in model_to_dict(plan).items() if value is not False and name != "id"}
    return {**{k: "on" if v is True else v for k, v in data.items()}, **changes}


def test_a_plan_change_shows_its_effect_on_tenants_before_it_is_saved(make_tenant: Any) -> None:
    from webapp.audit.models import AuditEvent
    from webapp.speech.models import UsagePeriod
    from webapp.speech.services.ledger import period_start
    from webapp.tenants.models import Plan

    busy = make_tenant(monthly_characters=10_000)
    UsagePeriod.objects.create(organization=busy.org, period=period_start(), characters_used=6_000)
    plan = busy.org.plan
    quiet = make_tenant()
    quiet.org.plan = plan
    quiet.org.save()
    client, _ = staff_client()
    url = f"/admin/tenants/plan/{plan.pk}/change/"

    preview = client.post(url, _plan_form(plan, monthly_characters=5_000))
    assert preview.status_code == 200
    rows = {row["tenant"].pk: row["over"] for row in preview.context["impact"]}
    assert rows == {busy.org.pk: ["monthly characters: 6,000 > 5,000"], quiet.org.pk: []}
    assert Plan.objects.get(pk=plan.pk).monthly_characters == 10_000, "nothing saved before the confirmation"

    saved = client.post(url, _plan_form(plan, monthly_characters=5_000, _confirmed="1"))
    assert saved.status_code == 302
    assert Plan.objects.get(pk=plan.pk).monthly_characters == 5_000
    event = AuditEvent.objects.get(action="admin.tenants_plan_change")
    assert event.ip == STAFF_IP and event.details["object_id"] == str(plan.pk)
    assert event.request_id and event.actor_label == "operator"


def test_the_audit_log_is_searchable(make_tenant: Any) -> None:
    tenant = make_tenant()
    client, _ = staff_client()
    response = client.get("/admin/audit/auditevent/", {"q": tenant.key.prefix})
    assert response.status_code == 200
    assert [e.action for e in response.context["cl"].result_list] == ["key.created"]


def test_prune_records_removes_audit_events_past_retention(db: None, settings: Any) -> None:
    from webapp.audit.models import AuditEvent
    from webapp.audit.services import record
    from webapp.housekeeping.catalog import run_job

    old = record("key.revoked", target="an old key")
    AuditEvent.objects.filter(pk=old.pk).update(
        at=timezone.now() - dt.timedelta(days=settings.TTS_AUDIT_RETENTION_DAYS + 1)
    )
    recent = record("key.revoked", target="a recent key")
    result = run_job("prune_records")
    assert result.counts["audit_events"] == 1
    assert list(AuditEvent.objects.values_list("pk", flat=True)) == [recent.pk]
