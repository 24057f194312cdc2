"""The Consents page and the voice page's consent parts: the API's services behind a session, roles, CSRF.

The recordings are real speech (flite reading the phrase), decoded and recognised by the
same children as the API's (tests/integration/api/test_voice_consents.py); the page's
microphone is tested in the browser (tests/e2e/test_dashboard_consents.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests import prompt_files as pf
from tests.dashboard_data import make_owner, member_of
from tests.integration.dashboard.conftest import client_for
from webapp.speech.models import Voice, VoiceConsent

pytestmark = pytest.mark.usefixtures("recognised_consent_codes")

PAGE = "/app/voices/consents/"
PHRASE = "/app/voices/consents/phrase/"
RECORD = "/app/voices/consents/record/"


def phrase(client: Client, language: str = "en") -> dict[str, Any]:
    answer = client.post(PHRASE, json.dumps({"language": language}), content_type="application/json")
    assert answer.status_code == 200, answer.content
    body: dict[str, Any] = answer.json()
    return body


def reading(tmp: Path, text: str) -> Path:
    return pf.read_aloud("slt", tmp / f"slt-{hashlib.sha1(text.encode()).hexdigest()[:8]}.wav", text)


def record(client: Client, path: Path, **fields: str) -> Any:
    with open(path, "rb") as fh:
        return client.post(RECORD, {"name": "Ann", "language": "en", "recording": fh, **fields})


def consent_of(org: Any, code: str = "") -> VoiceConsent:
    """A recorded consent as record_consent leaves it, without a recording step."""
    return VoiceConsent.objects.create(
        organization=org,
        name="Bea",
        language="en",
        phrase_text="I agree.",
        code=code or "123456",
        checked_by=VoiceConsent.Check.RECOGNISED,
        recording_path=f"consents/{org.pk}/x.wav",
        recording_sha256="0" * 64,
        created_by_label="owner@example.com",
    )


def ready_voice(org: Any) -> Voice:
    """An uploaded voice as its analysis leaves it, without a consent."""
    return Voice.objects.create(
        voice_id="voice-mine",
        organization=org,
        name="Mine",
        engine="piper",
        language="en",
        sample_rate=16000,
        status=Voice.Status.READY,
        embedding=[0.1],
    )


def problem_code(answer: Any) -> str:
    assert answer["Content-Type"] == "application/problem+json", answer.content
    return str(answer.json()["code"])


def test_a_phrase_read_aloud_becomes_a_listed_consent_and_can_be_revoked(
    owner: tuple[Any, Any], tmp_path: Path
) -> None:
    client = client_for(owner[0])
    issued = phrase(client)
    assert issued["id"].startswith("phr_") and issued["code"] in issued["text"].replace(" ", "")
    assert issued["checked"] is True and issued["expires_at"]
    answer = record(client, reading(tmp_path, issued["text"]), phrase=issued["id"])
    assert answer.status_code == 201, answer.content
    consent = VoiceConsent.objects.get(organization=owner[1])
    assert answer.json()["id"] == consent.consent_id and consent.created_by == owner[0]
    page = client.get(PAGE).content.decode()
    row = re.search(rf'<tr data-consent="{consent.consent_id}" data-status="active">.*?</tr>', page, re.S)
    assert row is not None and "owner@example.com" in row.group(0) and "Revoke" in row.group(0)
    assert "is recorded" in page  # the message the script's reload shows

    revoked = client.post(f"/app/voices/consents/{consent.pk}/revoke/")
    assert revoked.status_code == 302 and revoked["Location"] == PAGE
    consent.refresh_from_db()
    assert consent.status == VoiceConsent.Status.REVOKED and consent.revoked_by_label == "owner@example.com"
    assert 'data-status="revoked"' in client.get(PAGE).content.decode()


def test_another_code_read_is_a_mismatch_with_the_servers_message(
    owner: tuple[Any, Any], tmp_path: Path
) -> None:
    client = client_for(owner[0])
    issued = phrase(client)
    wrong = "".join(str((int(c) + 5) % 10) for c in issued["code"])
    spoken = issued["text"].replace(" ".join(issued["code"]), " ".join(wrong))
    answer = record(client, reading(tmp_path, spoken), phrase=issued["id"])
    assert answer.status_code == 422 and problem_code(answer) == "consent_mismatch"
    assert answer.json()["field"] == "recording" and "code" in answer.json()["detail"]
    assert not VoiceConsent.objects.filter(organization=owner[1]).exists()


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"name": ""}, 400, "invalid_request"),
        ({"name": "x" * 201}, 400, "invalid_request"),
        ({"language": "en us!"}, 400, "invalid_language"),
        ({"phrase": "phr_nothex"}, 400, "invalid_id"),
        ({"phrase": "phr_" + "0" * 32}, 404, "not_found"),
        ({"language": "xx"}, 400, "consent_attestation_required"),
    ],
)
def test_bad_fields_are_problems_not_errors(
    owner: tuple[Any, Any], tmp_path: Path, fields: dict[str, str], status: int, code: str
) -> None:
    client = client_for(owner[0])
    phrase(client, "xx")
    answer = record(client, pf.write(tmp_path / "tone.wav", pf.tone(3.0)), **fields)
    assert answer.status_code == status and problem_code(answer) == code


def test_no_recording_and_bad_phrase_requests_are_problems(owner: tuple[Any, Any]) -> None:
    client = client_for(owner[0])
    answer = client.post(RECORD, {"name": "Ann", "language": "en"})
    assert answer.status_code == 400 and answer.json()["field"] == "recording"
    for body in ("not json", "[1]", '{"language": 5}', '{"language": ""}'):
        answer = client.post(PHRASE, body, content_type="application/json")
        assert answer.status_code == 400, body
        assert problem_code(answer) in ("invalid_request", "invalid_language")


def test_only_an_owner_attests_a_language_the_recogniser_cannot_check(
    owner: tuple[Any, Any], tmp_path: Path
) -> None:
    admin = client_for(member_of(owner[1], "admin@example.com", "admin"))
    issued = phrase(admin, "xx")
    assert issued["checked"] is False
    speech = reading(tmp_path, issued["text"])
    refused = record(admin, speech, language="xx", phrase=issued["id"], attestation="true")
    assert refused.status_code == 403 and problem_code(refused) == "permission_denied"
    assert 'id="attestation"' not in admin.get(PAGE).content.decode()
    owner_client = client_for(owner[0])
    assert 'id="attestation"' in owner_client.get(PAGE).content.decode()
    kept = record(owner_client, speech, language="xx", phrase=issued["id"], attestation="true")
    assert kept.status_code == 201, kept.content
    assert VoiceConsent.objects.get(organization=owner[1]).checked_by == VoiceConsent.Check.ATTESTED


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_roles_without_voices_write_see_the_list_only(
    owner: tuple[Any, Any], tmp_path: Path, role: str
) -> None:
    consent = consent_of(owner[1])
    client = client_for(member_of(owner[1], f"{role}@example.com", role))
    page = client.get(PAGE)
    assert page.status_code == 200
    text = page.content.decode()
    assert consent.consent_id in text and "Revoke" not in text and 'id="consent-record"' not in text
    assert client.post(PHRASE, "{}", content_type="application/json").status_code == 403
    assert record(client, pf.write(tmp_path / "tone.wav", pf.tone(3.0))).status_code == 403
    assert client.post(f"/app/voices/consents/{consent.pk}/revoke/").status_code == 403
    consent.refresh_from_db()
    assert consent.status == VoiceConsent.Status.ACTIVE


def test_another_tenants_consent_and_phrase_are_not_found(owner: tuple[Any, Any], tmp_path: Path) -> None:
    other_owner, other_org = make_owner("other@example.com", "Other")
    theirs = consent_of(other_org)
    their_phrase = phrase(client_for(other_owner))
    client = client_for(owner[0])
    assert client.post(f"/app/voices/consents/{theirs.pk}/revoke/").status_code == 404
    voice = ready_voice(owner[1])
    answer = client.post(f"/app/voices/{voice.pk}/consent/", {"consent": theirs.consent_id})
    assert answer.status_code == 404
    answer = record(client, pf.write(tmp_path / "tone.wav", pf.tone(3.0)), phrase=their_phrase["id"])
    assert answer.status_code == 404 and problem_code(answer) == "not_found"
    assert theirs.consent_id not in client.get(PAGE).content.decode()
    theirs.refresh_from_db()
    assert theirs.status == VoiceConsent.Status.ACTIVE


def test_posts_need_the_csrf_token(owner: tuple[Any, Any]) -> None:
    consent = consent_of(owner[1])
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner[0])
    assert client.post(f"/app/voices/consents/{consent.pk}/revoke/").status_code == 403
    assert client.post(PHRASE, "{}", content_type="application/json").status_code == 403
    assert client.post(RECORD, {"name": "Ann"}).status_code == 403
    consent.refresh_from_db()
    assert consent.status == VoiceConsent.Status.ACTIVE
    client.get(PAGE)  # sets the cookie; the page's script sends it back as X-CSRFToken
    token = client.cookies["csrftoken"].value
    answer = client.post(PHRASE, "{}", content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert answer.status_code == 200


def test_an_upload_naming_a_consent_is_tied_to_it(owner: tuple[Any, Any], tmp_path: Path) -> None:
    consent = consent_of(owner[1])
    revoked = consent_of(owner[1], code="654321")
    VoiceConsent.objects.filter(pk=revoked.pk).update(status=VoiceConsent.Status.REVOKED)
    client = client_for(owner[0])
    page = client.get("/app/voices/").content.decode()
    assert f'<option value="{consent.consent_id}">' in page and revoked.consent_id not in page
    assert 'data-recorder="prompt"' in page
    audio, rate = pf.speech(tmp_path)
    prompt = pf.write(tmp_path / "five.wav", audio[: rate * 5], rate)
    with open(prompt, "rb") as fh:
        data = {"name": "Bea", "transcript": "", "recorded_consent": revoked.consent_id, "audio": fh}
        assert client.post("/app/voices/upload/", data).status_code == 400  # not a choice
    with open(prompt, "rb") as fh:
        data = {"name": "Bea", "transcript": "", "recorded_consent": consent.consent_id, "audio": fh}
        answer = client.post("/app/voices/upload/", data)
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    voice = Voice.objects.get(organization=owner[1])
    assert voice.consent_id == consent.pk and voice.consent_by == owner[0]
    assert consent.consent_id in client.get("/app/voices/").content.decode()


def test_adding_a_consent_to_a_voice_shows_the_services_refusals(owner: tuple[Any, Any]) -> None:
    consent = consent_of(owner[1])
    voice = ready_voice(owner[1])
    client = client_for(owner[0])
    page = client.get("/app/voices/").content.decode()
    assert f'action="/app/voices/{voice.pk}/consent/"' in page
    answer = client.post(f"/app/voices/{voice.pk}/consent/", {"consent": consent.consent_id}, follow=True)
    assert "still being analysed" in answer.content.decode() and "again shortly" in answer.content.decode()
    answer = client.post(f"/app/voices/{voice.pk}/consent/", {"consent": "nonsense"}, follow=True)
    assert "Choose a recorded consent" in answer.content.decode()
    viewer = client_for(member_of(owner[1], "viewer@example.com", "viewer"))
    assert viewer.post(f"/app/voices/{voice.pk}/consent/", {"consent": consent.consent_id}).status_code == 403
    voice.refresh_from_db()
    assert voice.consent_id is None
