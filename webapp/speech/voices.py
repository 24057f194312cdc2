"""Voices: the built-in ones workers announce, and a tenant's own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import transaction

from webapp.errors import DomainError, ErrorCode
from webapp.speech import lifecycle
from webapp.speech.models import Voice
from webapp.speech.services import prompts, sentence_cache
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
        org_id, voice_pk = locked.organization_id, locked.pk
        transaction.on_commit(lambda: sentence_cache.purge_voice(org_id, voice_pk))  # its rendered sentences
        locked.delete()
