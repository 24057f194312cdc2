"""Voice consents: a phrase with a code, its recording checked (flite reads it), revocation, isolation.

The recordings are real speech (flite), decoded by the sandboxed child and recognised by
pocketsphinx in its own child, as in production; the speaker check and the jobs are in
tests/integration/worker/test_consented_cloning.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from django.conf import settings

from tests import prompt_files as pf
from tests.integration.api.conftest import ApiClient, Tenant, problem
from tests.integration.api.people import key_for, member

pytestmark = pytest.mark.usefixtures("recognised_consent_codes")

OPENAI = "/v1/audio/voice_consents"
NATIVE = "/api/v1/voice_consents"


def phrase(client: ApiClient, base: str = OPENAI, language: str = "en") -> dict[str, Any]:
    r = client.get(f"{base}/phrase", {"language": language})
    assert r.status_code == 200, r.content
    body: dict[str, Any] = r.json()
    return body


def record(client: ApiClient, path: Path, base: str = NATIVE, **fields: str) -> Any:
    data: dict[str, Any] = {"name": "Ann", "language": "en", **fields}
    with open(path, "rb") as fh:
        data["recording"] = fh
        return client.client.post(base, data, **client._headers(None))


def reading(tmp: Path, text: str, voice: str = "slt") -> Path:
    return pf.read_aloud(voice, tmp / f"{voice}-{hashlib.sha1(text.encode()).hexdigest()[:8]}.wav", text)


def code_of(response: Any) -> str:
    """The error code, in OpenAI's shape under /v1/ (its SDKs parse that) and problem+json elsewhere."""
    if response.request["PATH_INFO"].startswith("/v1/"):
        return str(response.json()["error"]["code"])
    return str(problem(response)["code"])


def wrong_code(code: str) -> str:
    return "".join(str((int(c) + 5) % 10) for c in code)


def test_a_phrase_names_the_tenant_and_holds_a_fresh_six_digit_code(
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant()
    first, second = phrase(tenant.client), phrase(tenant.client, NATIVE)
    assert first["object"] == "audio.voice_consent_phrase" and first["id"].startswith("phr_")
    assert tenant.org.name in first["text"] and len(first["code"]) == 6 and first["code"].isdigit()
    assert " ".join(first["code"]) in first["text"]
    assert isinstance(first["expires_at"], int)  # Unix seconds on OpenAI's wire, ISO on ours
    assert dt.datetime.fromisoformat(second["expires_at"]) > dt.datetime.now(dt.UTC)
    left = first["expires_at"] - dt.datetime.now(dt.UTC).timestamp()
    assert 9 * 60 < left <= settings.TTS_CONSENT_PHRASE_MINUTES * 60
    assert first["id"] != second["id"]


def test_the_recording_of_the_phrase_becomes_a_consent(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.speech.models import VoiceConsent

    tenant = make_tenant()
    issued = phrase(tenant.client)
    r = record(tenant.client, reading(tmp_path, issued["text"]))
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["object"] == "audio.voice_consent" and body["id"].startswith("cons_")
    assert body["status"] == "active" and body["checked_by"] == "recognised"
    row = VoiceConsent.objects.get(organization_id=tenant.org.pk)
    assert row.heard_code == issued["code"] and row.code == issued["code"]
    stored = Path(settings.MEDIA_ROOT) / row.recording_path
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == body["recording_sha256"]
    listed = tenant.client.get(NATIVE).json()["data"]
    assert [c["id"] for c in listed] == [body["id"]]
    assert tenant.client.get(f"{OPENAI}/{body['id']}").json()["name"] == "Ann"


def test_a_recording_that_says_another_code_is_a_mismatch_and_nothing_is_kept(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.speech.models import VoiceConsent

    tenant = make_tenant()
    issued = phrase(tenant.client)
    spoken = issued["text"].replace(" ".join(issued["code"]), " ".join(wrong_code(issued["code"])))
    r = record(tenant.client, reading(tmp_path, spoken))
    assert r.status_code == 422 and problem(r)["code"] == "consent_mismatch", r.content
    assert problem(r)["check"] == "words"
    assert not VoiceConsent.objects.filter(organization_id=tenant.org.pk).exists()
    assert not list((Path(settings.MEDIA_ROOT) / "consents" / str(tenant.org.pk)).glob("*"))
    # The phrase was not used up: read right, it is kept.
    assert record(tenant.client, reading(tmp_path, issued["text"])).status_code == 201


def test_noise_is_unclear(make_tenant: Callable[..., Tenant], tmp_path: Path) -> None:
    tenant = make_tenant()
    phrase(tenant.client)
    r = record(tenant.client, pf.noise(tmp_path / "noise.wav"))
    assert r.status_code == 422 and problem(r)["code"] == "consent_unclear", r.content


def test_a_recording_under_16_khz_is_refused(make_tenant: Callable[..., Tenant], tmp_path: Path) -> None:
    tenant = make_tenant()
    issued = phrase(tenant.client)
    audio, rate = sf.read(reading(tmp_path, issued["text"]), dtype="float32")
    r = record(tenant.client, pf.eight_khz(tmp_path / "8k.wav", audio, rate))
    assert r.status_code == 400 and problem(r)["code"] == "sample_rate_too_low", r.content


def test_a_phrase_is_recorded_once_and_not_after_it_expired(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.speech.models import ConsentPhrase

    tenant = make_tenant()
    issued = phrase(tenant.client)
    wav = reading(tmp_path, issued["text"])
    assert record(tenant.client, wav, phrase=issued["id"]).status_code == 201
    again = record(tenant.client, wav, phrase=issued["id"])
    assert again.status_code == 409 and problem(again)["code"] == "consent_phrase_used"
    late = phrase(tenant.client)
    ConsentPhrase.objects.filter(pk=late["id"].removeprefix("phr_")).update(
        expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    )
    r = record(tenant.client, reading(tmp_path, late["text"]), phrase=late["id"])
    assert r.status_code == 410 and problem(r)["code"] == "consent_phrase_expired"


def test_a_recording_with_no_phrase_issued_is_refused(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    tenant = make_tenant()
    r = record(tenant.client, reading(tmp_path, "I consent. My code is 1 2 3 4 5 6."))
    assert r.status_code == 400 and problem(r)["code"] == "consent_phrase_required"


def test_another_tenants_phrase_and_consent_are_not_found(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    owner, stranger = make_tenant(), make_tenant()
    issued = phrase(owner.client)
    r = record(stranger.client, reading(tmp_path, issued["text"]), phrase=issued["id"])
    assert r.status_code == 404 and problem(r)["code"] == "not_found"
    consent = record(owner.client, reading(tmp_path, issued["text"])).json()["id"]
    assert stranger.client.get(f"{NATIVE}/{consent}").status_code == 404
    gone = stranger.client.delete(f"{OPENAI}/{consent}")
    assert gone.status_code == 404 and code_of(gone) == "not_found"
    with open(pf.flite("slt", tmp_path / "prompt.wav"), "rb") as fh:
        form = {"name": "Theirs", "consent": consent, "audio": fh}
        r = stranger.client.client.post("/api/v1/voices", form, **stranger.client._headers(None))
    assert r.status_code == 404 and problem(r)["code"] == "not_found"
    assert owner.client.get(f"{NATIVE}/{consent}").json()["status"] == "active"


def test_a_language_the_recogniser_cannot_check_needs_an_owners_attestation(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.audit.models import AuditEvent

    tenant = make_tenant()
    issued = phrase(tenant.client, language="de")
    assert issued["checked"] is False
    wav = reading(tmp_path, issued["text"])
    r = record(tenant.client, wav, language="de")
    assert r.status_code == 400 and problem(r)["code"] == "consent_attestation_required"
    r = record(tenant.client, wav, language="de", attestation="true")  # a tenant key acts as an admin
    assert r.status_code == 403 and problem(r)["code"] == "permission_denied"
    owner = key_for(tenant, member(tenant, "owner"), ["speech:read", "voices:write"])
    r = record(owner, wav, language="de", attestation="true")
    assert r.status_code == 201, r.content
    assert r.json()["checked_by"] == "attested"
    event = AuditEvent.objects.get(action="voice_consent.attested", organization_id=tenant.org.pk)
    assert event.details["consent"] == r.json()["id"] and event.actor_label.startswith("api key tts_")


def test_a_revoked_consent_is_kept_for_audit_and_no_voice_may_name_it(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.audit.models import AuditEvent

    tenant = make_tenant()
    issued = phrase(tenant.client)
    consent = record(tenant.client, reading(tmp_path, issued["text"])).json()["id"]
    r = tenant.client.delete(f"{OPENAI}/{consent}")
    assert r.status_code == 200 and r.json()["status"] == "revoked" and r.json()["revoked_at"]
    assert tenant.client.delete(f"{NATIVE}/{consent}").json()["status"] == "revoked"  # idempotent
    assert tenant.client.get(f"{NATIVE}/{consent}").json()["recording_sha256"]
    assert (
        AuditEvent.objects.filter(action="voice_consent.revoked", organization_id=tenant.org.pk).count() == 1
    )
    with open(pf.flite("slt", tmp_path / "prompt.wav"), "rb") as fh:
        form = {"name": "Ann", "consent": consent, "audio": fh}
        r = tenant.client.client.post("/api/v1/voices", form, **tenant.client._headers(None))
    assert r.status_code == 409 and problem(r)["code"] == "consent_revoked"


@pytest.mark.parametrize("base", [OPENAI, NATIVE])
def test_a_key_without_voices_write_records_nothing(
    make_tenant: Callable[..., Tenant], tmp_path: Path, base: str
) -> None:
    tenant = make_tenant(scopes=["speech:read", "speech:write"])
    assert tenant.client.get(f"{base}/phrase").status_code == 403
    r = record(tenant.client, pf.write(tmp_path / "t.wav", np.zeros(16000 * 3, dtype=np.float32)), base)
    assert r.status_code == 403 and code_of(r) == "permission_denied"


def test_a_plan_that_needs_recorded_consents_refuses_a_voice_on_the_uploaders_word(
    make_tenant: Callable[..., Tenant], tmp_path: Path
) -> None:
    from webapp.speech.models import Voice

    tenant = make_tenant(voices_need_recorded_consent=True)
    with open(pf.flite("slt", tmp_path / "prompt.wav"), "rb") as fh:
        form = {"name": "Ann", "consent": "true", "audio": fh}
        r = tenant.client.client.post("/api/v1/voices", form, **tenant.client._headers(None))
    assert r.status_code == 400 and problem(r)["code"] == "consent_required", r.content
    assert "recorded consent" in problem(r)["detail"]
    issued = phrase(tenant.client)
    consent = record(tenant.client, reading(tmp_path, issued["text"])).json()["id"]
    with open(pf.flite("slt", tmp_path / "prompt.wav"), "rb") as fh:
        form = {"name": "Ann", "consent": consent, "audio": fh}
        r = tenant.client.client.post("/api/v1/voices", form, **tenant.client._headers(None))
    assert r.status_code == 202, r.content
    assert Voice.objects.get(voice_id=r.json()["id"]).consent_id is not None
