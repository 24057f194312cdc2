"""A zero_shot voice that cannot be cloned now: refused naming why, unless the request lets its closest
voice speak instead (``voice_fallback: closest``, issue 52 point 4).

No model of the default install clones, so an active consent meets ``no_cloning_model`` here; the
cloning itself is tests/integration/voxcpm/test_consented_cloning.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.api.conftest import Tenant, problem, wait_finished

OPENAI = "/v1/audio/speech"
NATIVE = "/api/v1/speech"


def zero_shot_voice(tenant: Tenant, consent: str | None, closest: str = "en_US-joe-medium") -> Any:
    """A ready zero_shot voice row: its consent ``active``, ``revoked`` or none; ``closest``: the built-in
    voice its analysis measured as closest ("": none, as for a voice analysed zero_shot)."""
    from django.utils import timezone

    from webapp.speech.models import Voice, VoiceConsent

    row = None
    if consent is not None:
        row = VoiceConsent.objects.create(
            organization=tenant.org,
            name="Ann",
            language="en",
            phrase_text="I consent. My code is 1 2 3 4 5 6.",
            code="123456",
            checked_by=VoiceConsent.Check.RECOGNISED,
            heard_code="123456",
            recording_sha256="0" * 64,
            created_by_label="test",
            status=consent,
            revoked_at=timezone.now() if consent == "revoked" else None,
        )
    pk = uuid.uuid4()
    return Voice.objects.create(
        id=pk,
        voice_id=f"voice-{pk.hex}",
        organization=tenant.org,
        name="Cloned voice",
        language="en",
        sample_rate=16000,
        status=Voice.Status.READY,
        prompt_path=f"voices/{tenant.org.pk}/{pk.hex}.wav",
        cloning_mode="zero_shot",
        consent=row,
        closest_voice=closest,
        pitch_shift=2.0 if closest else 0.0,
        embedding=[0.1] * 256,
    )


@pytest.mark.parametrize(
    ("consent", "engine", "reason"),
    [
        (None, None, "no_consent"),
        ("revoked", None, "consent_revoked"),
        ("active", None, "no_cloning_model"),
        ("active", "piper", "model_cannot_clone"),
    ],
)
def test_by_default_a_voice_that_cannot_be_cloned_is_refused_naming_why(
    make_tenant: Callable[..., Tenant],
    builtin_voices: list[str],
    consent: str | None,
    engine: str | None,
    reason: str,
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    voice = zero_shot_voice(tenant, consent)
    body: dict[str, Any] = {
        "text": "Hello.",
        "voice": voice.voice_id,
        **({"engine": engine} if engine else {}),
    }
    for sent in (body, {**body, "voice_fallback": "none"}):
        r = tenant.client.post(NATIVE, sent)
        assert r.status_code == 422, r.content
        assert problem(r)["code"] == "cloning_unavailable" and problem(r)["reason"] == reason
    # OpenAI's wire: the same refusal in its shape (voice_fallback is an extension field there).
    r = tenant.client.post(OPENAI, {"model": engine or "tts-1", "voice": voice.voice_id, "input": "Hello."})
    assert r.status_code == 422 and r.json()["error"]["code"] == "cloning_unavailable", r.content
    assert not SynthesisJob.objects.filter(organization=tenant.org).exists()


def test_without_a_measured_closest_voice_the_fallback_is_refused_saying_so(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str]
) -> None:
    tenant = make_tenant()
    voice = zero_shot_voice(tenant, None, closest="")
    r = tenant.client.post(NATIVE, {"text": "Hello.", "voice": voice.voice_id, "voice_fallback": "closest"})
    body = problem(r)
    assert r.status_code == 422 and body["code"] == "cloning_unavailable", body
    assert body["reason"] == "no_consent" and body["fallback"] == "unavailable"
    assert "no closest built-in voice" in body["detail"]
    # A named model the closest voice is not a voice of: the refusal stands.
    other = zero_shot_voice(tenant, "revoked")
    r = tenant.client.post(
        NATIVE, {"text": "Hi.", "voice": other.voice_id, "engine": "espeak", "voice_fallback": "closest"}
    )
    assert r.status_code == 422 and problem(r)["reason"] == "consent_revoked", r.content
    assert "not espeak" in problem(r)["detail"]


def test_an_unknown_fallback_is_a_400(make_tenant: Callable[..., Tenant], builtin_voices: list[str]) -> None:
    tenant = make_tenant()
    r = tenant.client.post(NATIVE, {"text": "Hello.", "voice_fallback": "any"})
    assert r.status_code == 400 and problem(r)["errors"][0]["field"] == "voice_fallback", r.content


@pytest.mark.parametrize("consent", [None, "revoked"])
def test_a_request_that_allows_it_is_spoken_by_the_closest_voice(
    make_tenant: Callable[..., Tenant], builtin_voices: list[str], consent: str | None
) -> None:
    from webapp.speech import submission
    from webapp.speech.lifecycle import submit_job

    tenant = make_tenant()
    voice = zero_shot_voice(tenant, consent)
    data = {"text": "Hello there.", "voice": voice.voice_id, "pitch": 1.0, "voice_fallback": "closest"}
    request = submission.job_request(tenant.org, data)
    assert request.closest_fallback and request.speaker is not None
    job, _ = submit_job(tenant.org, request)  # queued: its dispatch waits for a commit that never comes
    assert job.cloning_mode == "approximate" and job.voice_name == "en_US-joe-medium"
    assert job.engine == "piper" and job.params["pitch"] == 3.0  # the voice's measured shift added


def test_the_fallback_speaks_through_both_wires(live_tenant: Callable[..., Tenant]) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    voice = zero_shot_voice(tenant, "revoked")
    r = tenant.client.post(NATIVE, {"text": "Hello.", "voice": voice.voice_id, "voice_fallback": "closest"})
    assert r.status_code == 202, r.content
    done = wait_finished(tenant.client, r.json()["id"])
    assert done["status"] == "succeeded" and done["voice"] == "en_US-joe-medium", done
    wav = {"model": "tts-1", "voice": voice.voice_id, "input": "Hello.", "response_format": "wav"}
    assert tenant.client.post(OPENAI, wav).status_code == 422  # the extension field left out: refused
    r = tenant.client.post(OPENAI, {**wav, "voice_fallback": "closest"})
    assert r.status_code == 200 and b"".join(r.streaming_content).startswith(b"RIFF")
    jobs = SynthesisJob.objects.filter(organization=tenant.org, source="openai")
    assert [(j.cloning_mode, j.voice_name) for j in jobs] == [("approximate", "en_US-joe-medium")]
