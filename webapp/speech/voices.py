"""Voices: the built-in ones workers announce, and a tenant's own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from webapp.audit import services as audit
from webapp.errors import DomainError, ErrorCode
from webapp.speech import lifecycle
from webapp.speech.models import SynthesisJob, Voice, VoiceConsent
from webapp.speech.services import consents, events, files, prompts, sentence_cache
from webapp.tenants.models import Organization

if TYPE_CHECKING:
    from synth.registry import VoiceInfo


def sync_builtin_voices(voices: Iterable[VoiceInfo]) -> int:
    """Upsert the built-in voices a worker serves (they carry no tenant)."""
    count = 0
    with transaction.atomic(durable=True):
        for info in voices:
            Voice.objects.update_or_create(
                voice_id=info.id,
                defaults={
                    "organization": None,
                    "name": info.name,
                    "engine": info.engine,
                    "language": info.language,
                    "sample_rate": info.sample_rate,
                    "capabilities": {**info.capabilities, "aliases": list(info.aliases)},
                    "status": Voice.Status.READY,
                    "status_reason": "",
                },
            )
            count += 1
    return count


def retire_engines(installed: set[str]) -> set[str]:
    """Built-in voices of engines outside ``installed`` stop being ready; returns those engines.

    Kept as rows (stored jobs name them); a worker that serves the engine again makes them
    ready again (``sync_builtin_voices``).
    """
    with transaction.atomic(durable=True):
        gone = Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY).exclude(
            engine__in=installed
        )
        engines = set(gone.values_list("engine", flat=True))
        gone.update(
            status=Voice.Status.DELETED, status_reason="its engine is not installed on any live worker"
        )
    return engines


def delete_voice(organization: Organization, voice: Voice) -> None:
    """Delete a tenant's own voice (its jobs keep their voice name). Built-in voices cannot be deleted."""
    if voice.organization_id != organization.pk:
        raise DomainError(ErrorCode.BUILTIN_VOICE, "Built-in voices cannot be deleted.")
    with transaction.atomic(durable=True):
        locked = Voice.objects.select_for_update().filter(pk=voice.pk).first()
        if locked is None:
            return
        # Biometric data: its queued jobs fail `voice_deleted`, its files go at commit.
        lifecycle.fail_jobs_of_deleted_voice(locked)
        prompts.remove_voice_files(locked)
        if not locked.one_off:
            # A request's reference audio leaves its consent's recording: the next request naming
            # that consent is checked against it again.
            _drop_consent_recording(locked)
        org_id, voice_pk = locked.organization_id, locked.pk
        transaction.on_commit(lambda: sentence_cache.purge_voice(org_id, voice_pk))  # its rendered sentences
        locked.delete()


def _drop_consent_recording(voice: Voice) -> None:
    """Inside a voice's deletion: its consent's recording goes with the last voice naming it (the
    consent row stays for audit, with the recording's checksum)."""
    if (
        voice.consent_id is None
        or Voice.objects.filter(consent_id=voice.consent_id).exclude(pk=voice.pk).exists()
    ):
        return
    consent = VoiceConsent.objects.select_for_update().get(pk=voice.consent_id)
    path = consent.recording_path
    consent.recording_path, consent.embedding = "", None  # biometric data, as the prompt's
    consent.save(update_fields=["recording_path", "embedding"])
    if path:
        transaction.on_commit(lambda: files.remove_file(path))


def revoke_consent(organization: Organization, consent_id: str, label: str, actor: Any) -> VoiceConsent:
    """Revoke a tenant's consent: no voice naming it is cloned from now on, and the queued and running
    jobs that clone one end ``consent_revoked`` (a running one at its next sentence). Idempotent; the
    record is kept for audit.

    One transaction, locks in the order consent, job, tenant (a voice upload naming the consent
    locks it before its tenant too). ``actor``: who revokes it (a user or an API key), for the audit log.
    """
    found = consents.get_consent(organization, consent_id)
    with transaction.atomic(durable=True):
        consent = VoiceConsent.objects.select_for_update().get(pk=found.pk)
        if consent.status == VoiceConsent.Status.REVOKED:
            return consent
        consent.status = VoiceConsent.Status.REVOKED
        consent.revoked_at = timezone.now()
        consent.revoked_by_label = label[:300]
        consent.save(update_fields=["status", "revoked_at", "revoked_by_label"])
        ended = lifecycle.fail_jobs_of_revoked_consent(consent)
        audit.record(
            "voice_consent.revoked",
            target=consent,
            organization=organization,
            actor=actor,
            details={"consent": consent.consent_id, "jobs_ended": ended},
        )
    return consent


def add_consent(organization: Organization, voice: Voice, consent_id: str, actor: Any) -> Voice:
    """Name a recorded consent on one of the tenant's ready voices: it may be cloned from now on."""
    consent = consents.usable_consent(organization, consent_id)
    updated = prompts.attach_consent(organization, voice, consent)
    audit.record(
        "voice.consent_added",
        target=updated,
        organization=organization,
        actor=actor,
        details={"consent": consent.consent_id, "cloning_mode": updated.cloning_mode},
    )
    return updated


def forget_one_off(organization: Organization, voice: Voice) -> None:
    """Delete a request's reference-audio voice unless a job still to run uses it."""
    if not voice.one_off:
        raise ValueError("only a one-off voice is forgotten with its job")
    active = (SynthesisJob.Status.QUEUED, SynthesisJob.Status.RUNNING)
    if SynthesisJob.objects.filter(voice_id=voice.pk, status__in=active).exists():
        return
    delete_voice(organization, voice)


def one_off_job_ended(event: events.JobEnded) -> None:
    """After a job ended: the reference audio it was cloned from goes (biometric data kept no longer)."""
    row = Voice.objects.filter(one_off=True, jobs__id=event.job_id).select_related("organization").first()
    if row is not None and row.organization is not None:
        forget_one_off(row.organization, row)
