"""Housekeeping of voice prompts: analyses that never finished, files of deleted voices."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.conf import settings
from django.db import models, transaction

from webapp.housekeeping.disk import voice_path_fields
from webapp.housekeeping.jobs import Context, job
from webapp.speech.models import Voice
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
