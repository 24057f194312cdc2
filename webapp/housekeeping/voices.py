"""Housekeeping of voice prompts: analyses that never finished, files of deleted voices."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import models, transaction

from webapp.housekeeping.disk import voice_path_fields
from webapp.housekeeping.jobs import Context, job
from webapp.speech import voices
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.services import files, prompts


@job("reject_stale_voices", "Mark voice prompts left in processing too long as rejected, with a reason.")
def reject_stale_voices(ctx: Context) -> None:
    timeout = settings.TTS_VOICE_PROCESSING_TIMEOUT_SECONDS
    cutoff = ctx.now - dt.timedelta(seconds=timeout)
    reason = (
        f"Analysis of this voice prompt did not finish within {max(1, timeout // 60)} minutes; "
        "please upload it again."
    )
    stale = Voice.objects.filter(status=Voice.Status.PROCESSING, updated_at__lt=cutoff)
    while not ctx.out_of_time():
        pks = list(stale.order_by("updated_at").values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        with transaction.atomic():
            # The conditions are repeated in the UPDATE: a voice whose analysis
            # finished meanwhile is no longer 'processing' and stays as it is.
            n = stale.filter(pk__in=pks).update(
                status=Voice.Status.REJECTED,
                status_reason=reason,
                rejected_code="analysis_failed",
                updated_at=ctx.now,
            )
            # Told to the tenant's webhooks in the same transaction (the rows this UPDATE changed).
            for voice in Voice.objects.filter(pk__in=pks, status=Voice.Status.REJECTED, updated_at=ctx.now):
                prompts.announce_voice(voice)
        ctx.add("rejected", n)
        if len(pks) < ctx.batch:
            break


def _has_any_path(fields: Iterable[str]) -> models.Q:
    q = models.Q()
    for name in fields:
        q |= ~models.Q(**{name: ""})
    return q


@job("delete_voice_files", "Delete the prompt files of deleted or rejected voices and clear their paths.")
def delete_voice_files(ctx: Context) -> None:
    fields = voice_path_fields()
    # Rejected prompts too (biometric data with no use left): reject_stale_voices leaves their files here.
    pending = Voice.objects.filter(
        _has_any_path(fields), status__in=[Voice.Status.DELETED, Voice.Status.REJECTED]
    )
    while not ctx.out_of_time():
        pks = list(pending.order_by("updated_at").values_list("pk", flat=True)[: ctx.batch])
        if not pks:
            break
        for pk in pks:
            with transaction.atomic():
                voice = pending.select_for_update().filter(pk=pk).first()
                if voice is None:
                    continue
                paths = [getattr(voice, name) for name in fields if getattr(voice, name)]
                for name in fields:
                    setattr(voice, name, "")
                voice.prompt_bytes = 0
                voice.save(update_fields=[*fields, "prompt_bytes", "updated_at"])
            # Files go after commit: a crash in between leaves an orphan file for
            # remove_orphan_files, never a row pointing at nothing.
            for relative in paths:
                ctx.add("bytes_freed", files.remove_file(relative))
            ctx.add("voices")
        if len(pks) < ctx.batch:
            break


@job("forget_one_off_voices", "Delete requests' reference audio (ref_audio) whose job ended or never came.")
def forget_one_off_voices(ctx: Context) -> None:
    # Normally deleted as its job ends (voices.one_off_job_ended); this catches a request that died
    # between its prompt and its submit, or an end whose after-commit hook was lost with its process.
    cutoff = ctx.now - dt.timedelta(seconds=settings.TTS_ONE_OFF_VOICE_GRACE_SECONDS)
    active = (SynthesisJob.Status.QUEUED, SynthesisJob.Status.RUNNING)
    stale = (
        Voice.objects.filter(one_off=True, created_at__lt=cutoff)
        .exclude(jobs__status__in=active)
        .select_related("organization")
    )
    seen: set[Any] = set()
    while not ctx.out_of_time():
        batch = [v for v in stale.exclude(pk__in=seen).order_by("created_at")[: ctx.batch]]
        if not batch:
            break
        for voice in batch:
            seen.add(voice.pk)
            if voice.organization is not None:
                voices.forget_one_off(voice.organization, voice)
                ctx.add("deleted")
        if len(batch) < ctx.batch:
            break
