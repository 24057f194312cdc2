"""A tenant's data export (issue 52: the consent record is exported with the tenant's data):
``GET /api/v1/organization/export`` for owners and admins, ``manage.py export_tenant``."""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.integration.api.conftest import Tenant, problem
from tests.integration.api.people import key_for, member

URL = "/api/v1/organization/export"
# Fields no export may hold, at any depth: secrets, password hashes, biometric data, file paths.
FORBIDDEN = {"password", "secret", "secret_hash", "previous_secret_hash", "embedding", "recording_path"}
FORBIDDEN |= {"prompt_path", "original_path", "text", "params"}


def consent(tenant: Tenant, name: str) -> Any:
    from webapp.speech.models import VoiceConsent

    return VoiceConsent.objects.create(
        organization=tenant.org,
        name=name,
        language="en",
        phrase_text=f"I consent to {tenant.org.name}. My code is 4 7 1 9 0 3.",
        code="471903",
        checked_by=VoiceConsent.Check.RECOGNISED,
        heard_code="471903",
        recording_path=f"consents/{tenant.org.pk}/{uuid.uuid4().hex}.wav",
        recording_sha256=uuid.uuid4().hex * 2,
        recording_bytes=96044,
        recording_seconds=3.0,
        embedding=[0.1] * 256,
        created_by_label=f"api key tts_{tenant.key.prefix}_",
    )


def tenant_data(tenant: Tenant, label: str) -> dict[str, Any]:
    """A voice naming an active consent, a revoked consent, a dictionary and a job, all ``label``'s."""
    from webapp.dictionaries.models import Dictionary, DictionaryVersion, Rule
    from webapp.speech.models import SynthesisJob, Voice

    active, revoked = consent(tenant, f"{label} active"), consent(tenant, f"{label} revoked")
    r = tenant.client.delete(f"/api/v1/voice_consents/{revoked.consent_id}")
    assert r.status_code == 200 and r.json()["status"] == "revoked", r.content
    voice = Voice.objects.create(
        voice_id=f"voice-{uuid.uuid4().hex}",
        organization=tenant.org,
        name=f"{label} voice",
        language="en",
        sample_rate=16000,
        prompt_path=f"voices/{tenant.org.pk}/x.wav",
        cloning_mode="zero_shot",
        consent=active,
        embedding=[0.2] * 256,
        transcript=f"{label} transcript",
    )
    dictionary = Dictionary.objects.create(organization=tenant.org, name=f"{label} words", latest_version=1)
    version = DictionaryVersion.objects.create(dictionary=dictionary, number=1, rule_count=1)
    Rule.objects.create(version=version, position=0, grapheme=f"{label}word", alias="alias")
    job = SynthesisJob.objects.create(
        organization=tenant.org,
        api_key=tenant.key,
        voice=voice,
        voice_name=voice.voice_id,
        engine="voxcpm",
        cloning_mode="zero_shot",
        text=f"{label} secret text",
        text_chars=20,
        format="wav",
        status="failed",
        error_code="consent_revoked",
    )
    return {"active": active, "revoked": revoked, "voice": voice, "job": job}


def keys_in(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_in(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_in(v)}
    return set()


def test_an_owner_exports_the_tenants_data_with_every_consents_audit_record(
    make_tenant: Callable[..., Tenant],
) -> None:
    from webapp.audit.models import AuditEvent

    tenant, stranger = make_tenant(), make_tenant()
    ours, theirs = tenant_data(tenant, "Ours"), tenant_data(stranger, "Theirs")
    owner = member(tenant, "owner")
    client = key_for(tenant, owner, ["keys:manage"])

    r = client.get(URL)
    assert r.status_code == 200, r.content
    assert r["Cache-Control"] == "no-store" and "attachment" in r["Content-Disposition"]
    doc = r.json()
    assert doc["object"] == "organization.export" and doc["organization"]["id"] == str(tenant.org.pk)
    assert not keys_in(doc) & FORBIDDEN, keys_in(doc) & FORBIDDEN
    assert [m["username"] for m in doc["members"]] == [owner.username]
    assert {k["prefix"] for k in doc["api_keys"]} >= {f"tts_{tenant.key.prefix}_"}

    consents = {c["id"]: c for c in doc["voice_consents"]}
    assert set(consents) == {ours["active"].consent_id, ours["revoked"].consent_id}
    revoked = consents[ours["revoked"].consent_id]
    assert revoked["status"] == "revoked" and revoked["revoked_at"] and revoked["revoked_by"]
    for row in (revoked, consents[ours["active"].consent_id]):
        assert row["phrase"].endswith("4 7 1 9 0 3.") and row["code"] == row["heard_code"] == "471903"
        assert row["recording_sha256"] and row["created_by"].startswith("api key tts_") and row["created_at"]
    assert consents[ours["active"].consent_id]["voices"] == [ours["voice"].voice_id]
    assert [v["consent"] for v in doc["voices"]] == [ours["active"].consent_id]
    assert doc["dictionaries"][0]["versions"][0]["rules"][0]["grapheme"] == "Oursword"
    assert [(j["id"], j["error_code"], j["api_key"]) for j in doc["jobs"]] == [
        (str(ours["job"].pk), "consent_revoked", f"tts_{tenant.key.prefix}_")
    ]

    # Nothing of the other tenant, under any name.
    text = json.dumps(doc)
    for value in (theirs["active"].consent_id, theirs["voice"].voice_id, str(theirs["job"].pk)):
        assert value not in text
    assert "Theirs" not in text and str(stranger.org.pk) not in text and "secret text" not in text
    event = AuditEvent.objects.get(action="organization.exported", organization_id=tenant.org.pk)
    assert event.details == {"voices": 1, "voice_consents": 2, "jobs": 1}


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_only_owners_and_admins_may_export(make_tenant: Callable[..., Tenant], role: str) -> None:
    tenant = make_tenant()
    # A key demoted after it was issued carries keys:manage; the role still refuses it.
    r = key_for(tenant, member(tenant, role), ["keys:manage"], role=role).get(URL)
    assert r.status_code == 403 and problem(r)["code"] == "permission_denied", r.content
    r = tenant.client.get(URL)  # the tenant's key without keys:manage
    assert r.status_code == 403 and "keys:manage" in problem(r)["detail"]
    admin = key_for(tenant, member(tenant, "admin"), ["keys:manage"])
    assert admin.get(URL).status_code == 200


def test_the_command_writes_the_same_document_atomically(
    make_tenant: Callable[..., Tenant], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenant = make_tenant()
    ours = tenant_data(tenant, "Ours")
    out = tmp_path / "export.json"
    out.write_text("old")
    call_command("export_tenant", tenant.org.slug, "--out", str(out))
    doc = json.loads(out.read_text())
    assert {c["id"] for c in doc["voice_consents"]} == {ours["active"].consent_id, ours["revoked"].consent_id}
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["export.json"]  # no temporary file left
    capsys.readouterr()
    call_command("export_tenant", str(tenant.org.pk))  # by id, to standard output
    assert json.loads(capsys.readouterr().out)["organization"]["slug"] == tenant.org.slug
    with pytest.raises(CommandError, match="No organization"):
        call_command("export_tenant", "no-such-tenant")
    with pytest.raises(CommandError, match="not a directory"):
        call_command("export_tenant", tenant.org.slug, "--out", str(tmp_path / "missing" / "x.json"))
