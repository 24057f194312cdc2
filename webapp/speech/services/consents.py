"""Consent to a synthetic voice: a phrase to read, its recording checked, revocable (docs/voices.md).

Cloning a voice needs a consent first, as the commercial services ask: the service
issues a phrase holding the tenant's name and a random six-digit code
(:func:`issue_phrase`), the speaker reads it, and :func:`record_consent` keeps the
recording only when speech recognition heard that code (English; other languages need
an owner's attestation, audited). The recording is decoded by the same limited child as
a voice prompt (``synth.prompt``) and recognised in a child of its own
(``synth.consent``), inside one of the host's decode slots: the web process does
neither. Which speaker it is, is the analysis worker's to compare with each voice that
names the consent. Revoking it is an action on voices (``webapp.speech.voices.revoke_consent``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from synth import consent as consent_check
from synth import consent_run
from synth.prompt import PromptRejected, prepare_prompt
from webapp.audit import services as audit
from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import ConsentPhrase, VoiceConsent
from webapp.speech.services import decodes, dispatch, files, prompts
from webapp.tenants.models import Organization

log = logging.getLogger(__name__)

MAX_LANGUAGE_CHARS = 35


@dataclass(frozen=True)
class ConsentRecording:
    """What a client sent with a consent recording."""

    name: str
    language: str
    phrase_id: str  # "" for the tenant's latest open phrase in the language
    attested: bool  # an owner attests the speaker said the phrase (languages the recogniser cannot check)
    created_by: Any  # the user, or None
    created_by_label: str
    actor: Any  # who records it (a user or an API key), for the audit log


def _language(language: str) -> str:
    language = language.strip()
    if not language or len(language) > MAX_LANGUAGE_CHARS or not language.replace("-", "").isalnum():
        raise DomainError(
            ErrorCode.INVALID_LANGUAGE,
            "language must be a language tag such as en or en-US.",
            field="language",
        )
    return language


def checked_language(language: str) -> bool:
    """Whether speech recognition checks recordings in ``language`` (else an owner attests them)."""
    return consent_run.recognises(language)


def _phrase_text(language: str, organization_name: str, code: str) -> str:
    """The phrase in ``language`` where there is one, else in English (a recording in a language the
    recogniser cannot check is attested by an owner instead)."""
    try:
        return consent_check.consent_phrase(language, organization_name, code)
    except consent_check.Unsupported:
        return consent_check.consent_phrase("en", organization_name, code)


def issue_phrase(organization: Organization, language: str) -> ConsentPhrase:
    """A new phrase with a random code for the tenant, valid for TTS_CONSENT_PHRASE_MINUTES."""
    language = _language(language)
    code = consent_check.new_code()
    now = timezone.now()
    return ConsentPhrase.objects.create(
        organization=organization,
        language=language,
        code=code,
        text=_phrase_text(language, organization.name, code),
        created_at=now,
        expires_at=now + dt.timedelta(minutes=settings.TTS_CONSENT_PHRASE_MINUTES),
    )


def _phrase_pk(phrase_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(phrase_id.removeprefix("phr_"))
    except ValueError:
        raise DomainError(
            ErrorCode.INVALID_ID, f"{phrase_id!r} is not a phrase id.", field="phrase"
        ) from None


def _open_phrase(organization: Organization, language: str, phrase_id: str) -> ConsentPhrase:
    """The phrase the recording reads: the one named, else the tenant's latest in the language."""
    if phrase_id:
        phrase = ConsentPhrase.objects.filter(pk=_phrase_pk(phrase_id), organization=organization).first()
        if phrase is None:
            raise DomainError(ErrorCode.NOT_FOUND, f"No phrase {phrase_id}.", field="phrase")
    else:
        phrase = (
            ConsentPhrase.objects.filter(organization=organization, language=language, used_at__isnull=True)
            .order_by("-created_at")
            .first()
        )
        if phrase is None:
            raise DomainError(
                ErrorCode.CONSENT_PHRASE_REQUIRED,
                f"No phrase was issued in {language}: get one from the phrase endpoint and read it.",
                field="phrase",
            )
    _usable(phrase, language)
    return phrase


def _usable(phrase: ConsentPhrase, language: str) -> None:
    if phrase.used_at is not None:
        raise DomainError(
            ErrorCode.CONSENT_PHRASE_USED, "This phrase was already recorded; get a new one.", field="phrase"
        )
    if phrase.expires_at <= timezone.now():
        raise DomainError(
            ErrorCode.CONSENT_PHRASE_EXPIRED,
            f"This phrase expired at {phrase.expires_at:%H:%M:%S} UTC; get a new one.",
            field="phrase",
        )
    if phrase.language != language:
        raise DomainError(
            ErrorCode.INVALID_LANGUAGE,
            f"The phrase was issued in {phrase.language}, not {language}.",
            field="language",
        )


def record_consent(
    organization: Organization, upload_path: str, recording: ConsentRecording, admitted: prompts.Admitted
) -> VoiceConsent:
    """Decode and check the recording of a phrase; keep it as the tenant's consent when it passes.

    ``upload_path`` is a temporary file the caller removes. Refusals: the phrase (missing,
    used, expired: before the file is read), the recording (``prompts``' codes, under 16 kHz
    ``sample_rate_too_low``), the words (``consent_mismatch`` when another code was heard,
    ``consent_unclear`` when none was), an unchecked language without an owner's attestation.
    """
    if admitted.organization_id != organization.pk:
        raise ValueError("an upload admitted for another tenant")
    language = _language(recording.language)
    phrase = _open_phrase(organization, language, recording.phrase_id)
    checked = checked_language(language)
    if not checked and not recording.attested:
        raise DomainError(
            ErrorCode.CONSENT_ATTESTATION_REQUIRED,
            f"Recordings in {language} cannot be checked by speech recognition; an owner must "
            "attest that the speaker read the phrase (attestation=true).",
            field="attestation",
        )
    if not connection.in_atomic_block:
        connection.close()  # back to the pool while the upload waits for a decoder (prompts.create_voice)
    consent_uuid = uuid.uuid4()
    relative = f"consents/{organization.pk}/{consent_uuid.hex}.wav"
    target = files.media_path(relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        with decodes.decode_slot(organization.pk):
            stats = prepare_prompt(
                upload_path,
                target,
                prompts.decode_limits(
                    organization, settings.TTS_CONSENT_MIN_SECONDS, settings.TTS_CONSENT_MAX_SECONDS
                ),
            )
            verdict = (
                consent_run.check_words_in_child(
                    target, phrase.text, phrase.code, timeout=settings.TTS_PROMPT_DECODE_TIMEOUT_SECONDS
                )
                if checked
                else None
            )
    except PromptRejected as exc:
        raise DomainError(prompts.upload_error(exc.code), exc.message, field="recording") from exc
    try:
        if verdict is not None and not verdict.passed:
            raise _refusal(verdict)
        return _insert(
            organization, consent_uuid, relative, stats.trimmed_seconds, phrase, recording, verdict
        )
    except BaseException:
        files.remove_file(relative)
        raise


def _refusal(verdict: consent_check.WordsVerdict) -> DomainError:
    if verdict.reason == "consent_unclear":
        return DomainError(
            ErrorCode.CONSENT_UNCLEAR,
            "The recording could not be understood: read the whole phrase clearly, close to the microphone.",
            field="recording",
            extra={"check": "words"},
        )
    return DomainError(
        ErrorCode.CONSENT_MISMATCH,
        "The recording does not say the phrase's code.",
        field="recording",
        extra={"check": "words"},
    )


def _insert(
    organization: Organization,
    consent_uuid: uuid.UUID,
    relative: str,
    seconds: float,
    phrase: ConsentPhrase,
    recording: ConsentRecording,
    verdict: consent_check.WordsVerdict | None,
) -> VoiceConsent:
    path = files.media_path(relative)
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    with transaction.atomic(durable=True):
        # The phrase row is the lock: two recordings of one phrase cannot both be kept.
        locked = ConsentPhrase.objects.select_for_update().get(pk=phrase.pk)
        _usable(locked, phrase.language)
        now = timezone.now()
        locked.used_at = now
        locked.save(update_fields=["used_at"])
        consent = VoiceConsent.objects.create(
            id=consent_uuid,
            organization=organization,
            name=recording.name,
            language=phrase.language,
            phrase_text=phrase.text,
            code=phrase.code,
            checked_by=VoiceConsent.Check.RECOGNISED if verdict else VoiceConsent.Check.ATTESTED,
            heard_code=verdict.heard_code or "" if verdict else "",
            recording_path=relative,
            recording_sha256=digest,
            recording_bytes=os.path.getsize(path),
            recording_seconds=round(seconds, 2),
            created_by=recording.created_by,
            created_by_label=recording.created_by_label[:300],
            created_at=now,
        )
        pk = consent.pk
        transaction.on_commit(lambda: dispatch.send_consent_embedding(pk))
        if verdict is None:
            audit.record(
                "voice_consent.attested",
                target=consent,
                organization=organization,
                actor=recording.actor,
                details={"consent": consent.consent_id, "language": consent.language},
            )
    return consent


def get_consent(organization: Organization, consent_id: str) -> VoiceConsent:
    """The tenant's consent ``cons_…`` (``not_found`` for another tenant's, as for a missing one)."""
    try:
        pk = uuid.UUID(consent_id.removeprefix("cons_"))
    except ValueError:
        raise DomainError(ErrorCode.INVALID_ID, f"{consent_id!r} is not a consent id.") from None
    consent = VoiceConsent.objects.filter(pk=pk, organization=organization).first()
    if consent is None:
        raise DomainError(ErrorCode.NOT_FOUND, f"No consent {consent_id}.")
    return consent


def usable_consent(organization: Organization, consent_id: str) -> VoiceConsent:
    """The tenant's consent ``cons_…`` that a new voice may name: active, its recording still kept
    (``consent_revoked`` otherwise). The API's upload and the dashboard's take it the same way."""
    consent = get_consent(organization, consent_id)
    if consent.status != VoiceConsent.Status.ACTIVE:
        raise DomainError(ErrorCode.CONSENT_REVOKED, f"Consent {consent_id} was revoked.", field="consent")
    if not consent.recording_path:
        raise DomainError(
            ErrorCode.CONSENT_REVOKED,
            f"Consent {consent_id}'s recording was deleted with its voice; record a new consent.",
            field="consent",
        )
    return consent


def usable_consents(organization: Organization) -> list[VoiceConsent]:
    """The tenant's consents a new voice may name (:func:`usable_consent`), newest first."""
    rows = VoiceConsent.objects.filter(organization=organization, status=VoiceConsent.Status.ACTIVE)
    return list(rows.exclude(recording_path="").order_by("-created_at", "-id"))
