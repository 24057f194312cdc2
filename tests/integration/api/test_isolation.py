"""Tenant isolation matrix: another tenant's objects are 404 on every endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("synth_worker", "builtin_voices")


@pytest.fixture
def two_tenants(make_tenant: Any) -> Any:
    from webapp.speech.models import SynthesisJob, Voice

    a, b = make_tenant(), make_tenant()
    job_a = a.client.post("/api/v1/speech", {"text": "Tenant A's secret text."}).json()
    done = SynthesisJob.objects.get(id=job_a["id"])
    done.status, done.audio_path = "succeeded", f"audio/{a.org.pk}/{done.id}.wav"
    done.save()
    Voice.objects.create(
        voice_id=f"own-{a.org.slug}",
        organization=a.org,
        name="A's voice",
        engine="piper",
        language="en_US",
        sample_rate=22050,
        capabilities={},
    )
    return a, b, job_a["id"], f"own-{a.org.slug}"


def test_other_tenants_job_is_404_everywhere(two_tenants: Any) -> None:
    from webapp.speech.models import SynthesisJob

    a, b, job_id, _ = two_tenants
    calls = [
        ("get", f"/api/v1/speech/{job_id}"),
        ("get", f"/api/v1/speech/{job_id}/audio"),
        ("post", f"/api/v1/speech/{job_id}/cancel"),
        ("delete", f"/api/v1/speech/{job_id}"),
    ]
    for method, path in calls:
        response = getattr(b.client, method)(path)
        assert response.status_code == 404, (method, path, response.content)
        body = problem(response)
        assert "secret" not in response.content.decode() and body["code"] == "not_found"
    assert job_id not in b.client.get("/api/v1/speech").content.decode()
    assert SynthesisJob.objects.get(id=job_id).status == "succeeded"
    # ... while the owner still sees it.
    assert a.client.get(f"/api/v1/speech/{job_id}").status_code == 200
    assert a.client.get(f"/api/v1/speech/{job_id}/audio")["X-Accel-Redirect"].endswith(f"{job_id}.wav")


def test_other_tenants_voice_is_404_everywhere(two_tenants: Any) -> None:
    from webapp.speech.models import Voice

    a, b, _, voice_id = two_tenants
    assert b.client.get(f"/api/v1/voices/{voice_id}").status_code == 404
    assert b.client.delete(f"/api/v1/voices/{voice_id}").status_code == 404
    assert voice_id not in {v["id"] for v in b.client.get("/api/v1/voices").json()["results"]}
    using = b.client.post("/api/v1/speech", {"text": "Borrowed voice.", "voice": voice_id})
    assert using.status_code == 400 and problem(using)["field"] == "voice"
    assert voice_id in {v["id"] for v in a.client.get("/api/v1/voices").json()["results"]}
    assert Voice.objects.filter(voice_id=voice_id).exists()
    # The owner may delete its own voice; nobody may delete a built-in one.
    assert a.client.delete(f"/api/v1/voices/{voice_id}").status_code == 204
    builtin = a.client.delete("/api/v1/voices/en_US-joe-medium")
    assert builtin.status_code == 403 and problem(builtin)["code"] == "builtin_voice"
    assert Voice.objects.filter(voice_id="en_US-joe-medium").exists()


def test_a_submit_finds_only_voices_the_tenant_may_use(two_tenants: Any) -> None:
    from webapp.speech.models import Voice
    from webapp.speech.services.queries import visible_voice, visible_voices

    a, b, _, voice_id = two_tenants
    assert visible_voice(a.org, voice_id) is not None  # its own, ready
    assert visible_voice(b.org, voice_id) is None  # another tenant's
    assert visible_voice(b.org, "en_US-joe-medium") is not None  # built-in
    assert visible_voice(a.org, "no-such-voice") is None
    Voice.objects.filter(voice_id=voice_id).update(status=Voice.Status.PROCESSING)
    assert visible_voice(a.org, voice_id) is None  # not ready yet
    # The same rule as the listing, for every voice either tenant could name.
    for tenant in (a, b):
        for voice in Voice.objects.all():
            listed = visible_voices(tenant.org).filter(pk=voice.pk).exists()
            assert (visible_voice(tenant.org, voice.voice_id) is not None) == listed, voice.voice_id
