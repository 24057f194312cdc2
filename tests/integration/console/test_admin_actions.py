"""The admin console's actions on keys and jobs, through the services, with a real worker."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.integration.console.conftest import STAFF_IP, job_status, run_action, staff_client
from tests.reliability.helpers import wait_until
from webapp.errors import JobFailureCode

pytestmark = pytest.mark.usefixtures("builtin_voices")

LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long text that keeps the worker busy." for n in range(60)
)


def _events(action: str) -> list[Any]:
    from webapp.audit.models import AuditEvent

    return list(AuditEvent.objects.filter(action=action).order_by("at"))


@pytest.mark.parametrize("path", ["/admin/", "/admin/speech/synthesisjob/", "/admin/audit/auditevent/"])
def test_non_staff_are_sent_to_log_in(db: None, path: str) -> None:
    member = User.objects.create_user("member", "member@example.test", "pw-member-123")
    signed_in = Client()
    signed_in.force_login(member)
    for client in (Client(), signed_in):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")


def test_revoking_a_key_in_the_admin_stops_it_at_the_api(live_tenant: Any) -> None:
    from webapp.tenants.models import ApiKey

    tenant = live_tenant()
    assert tenant.client.get("/api/v1/voices").status_code == 200
    client, staff = staff_client()
    response = run_action(client, "tenants/apikey", "revoke", [tenant.key.pk])
    assert response.status_code == 302
    assert ApiKey.objects.get(pk=tenant.key.pk).revoked_at is not None
    assert tenant.client.get("/api/v1/voices").status_code == 401
    [event] = _events("key.revoked")
    assert (event.actor_id, event.actor_label, event.ip) == (staff.pk, "operator", STAFF_IP)
    assert event.organization_id == tenant.org.pk and event.target_id == str(tenant.key.pk)
    # The key's creation was recorded too (by the operator, outside any request).
    assert any(e.target_id == str(tenant.key.pk) for e in _events("key.created"))


def test_the_key_page_never_shows_the_hash(live_tenant: Any) -> None:
    tenant = live_tenant()
    client, _ = staff_client()
    page = client.get(f"/admin/tenants/apikey/{tenant.key.pk}/change/")
    assert page.status_code == 200
    assert tenant.key.secret_hash not in page.content.decode()
    assert tenant.key.prefix in page.content.decode()


def _failed_job(tenant: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A job that failed: submitted while its message 'is lost' (injected), then failed by the service."""
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import dispatch

    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)
        body = tenant.client.post("/api/v1/speech", {"text": "Hello from a job that failed once."}).json()
    assert lifecycle.fail_job(body["id"], JobFailureCode.SYNTHESIS_FAILED, "injected failure")
    return SynthesisJob.objects.get(id=body["id"])


def test_retry_requeues_a_failed_job_that_succeeds_and_is_charged_once(
    live_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod
    from webapp.speech.services import files

    tenant = live_tenant()
    failed = _failed_job(tenant, monkeypatch)
    client, _ = staff_client()
    assert run_action(client, "speech/synthesisjob", "retry", [failed.pk]).status_code == 302
    retry = SynthesisJob.objects.get(retry_of=failed)
    wait_until(lambda: job_status(retry.pk) not in ("queued", "running"), timeout=90, what="the retried job")
    retry.refresh_from_db()
    assert retry.status == "succeeded", retry.error_message
    kinds = sorted(UsageEvent.objects.filter(organization=tenant.org).values_list("job_key", "kind"))
    assert kinds == sorted(
        [(failed.pk, "reserve"), (failed.pk, "release"), (retry.pk, "reserve"), (retry.pk, "charge")]
    )
    usage = UsagePeriod.objects.get(organization=tenant.org)
    assert (usage.characters_used, usage.characters_reserved) == (retry.text_chars, 0)
    # A second retry of the same failed job is refused, and so is a retry of one that did not fail.
    run_action(client, "speech/synthesisjob", "retry", [failed.pk, retry.pk])
    assert SynthesisJob.objects.filter(organization=tenant.org).count() == 2
    [event] = _events("job.retried")
    assert event.target_id == str(failed.pk) and event.details == {"new_job": str(retry.pk)}

    # Expire now: the audio goes at once, the job says expired.
    path = files.media_path(retry.audio_path)
    assert run_action(client, "speech/synthesisjob", "expire_now", [retry.pk]).status_code == 302
    assert job_status(retry.pk) == "expired"
    import os

    assert not os.path.exists(path)
    assert [e.target_id for e in _events("job.expired")] == [str(retry.pk)]


def test_cancel_on_a_running_job_stops_it(live_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    tenant = live_tenant()
    body = tenant.client.post("/api/v1/speech", {"text": LONG_TEXT, "voice": "en_US-joe-medium"}).json()
    wait_until(lambda: job_status(body["id"]) == "running", timeout=90, what="the job to run")
    client, _ = staff_client()
    assert run_action(client, "speech/synthesisjob", "cancel", [body["id"]]).status_code == 302
    wait_until(lambda: job_status(body["id"]) == "canceled", timeout=60, what="the job to stop")
    job = SynthesisJob.objects.get(id=body["id"])
    assert job.audio_path == "" and job.progress < 1.0
    kinds = set(UsageEvent.objects.filter(job_key=job.pk).values_list("kind", flat=True))
    assert kinds == {"reserve", "release"}
    [event] = _events("job.canceled")
    assert event.details == {"was": "running"} and event.ip == STAFF_IP
