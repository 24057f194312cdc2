"""Retention: a finished job's audio expires, and its text (with its word timestamps) is blanked past
the plan's text retention.

Run by beat (webapp/housekeeping), and at once for an answer its client left
(``client._leave_answer``). Each public function is an outer action.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from webapp.speech.lifecycle._core import Status, _transition
from webapp.speech.models import JobTimestamps, SynthesisJob
from webapp.speech.services import files
from webapp.tenants.models import Organization


def expire_audio(job_id: Any, *, immediately: bool = False) -> int:
    """Remove a finished job's audio past retention (``immediately``: now) and mark it expired.

    Returns bytes freed.
    """
    # Never under a client still being handed the answer (its lease held): a plan keeping no audio
    # (retention_days=0) would expire it at once, and the answer would neither go out nor settle,
    # its reservation held for good. Its answer, or the reaper, ends the lease first.
    due = Q(status=Status.SUCCEEDED, waiter_until__isnull=True)
    if not immediately:
        due &= Q(expires_at__lte=timezone.now())
    with transaction.atomic(durable=True):
        row = (
            SynthesisJob.objects.select_for_update()
            .filter(due, id=job_id)
            .values("audio_path", "audio_bytes")
        )
        before = row.first()
        if before is None:
            return 0
        _transition(job_id, due, status=Status.EXPIRED, audio_path="", audio_bytes=0, timestamps_bytes=0)
        JobTimestamps.objects.filter(job_id=job_id).delete()  # they describe the audio: gone with it
    # After the commit: a file is never gone while a committed row still points at it.
    freed = files.remove_file(before["audio_path"])
    return freed or int(before["audio_bytes"])


def blank_old_texts(limit: int = 500) -> int:
    """Blank the text (and instructions) of finished jobs past their plan's text retention; returns how many.

    The text is the tenant's content and goes; the row stays, with what history
    and usage need (key, voice, source, characters, times, status). Judged by the
    database clock: ``finished_at`` is set by it. Only the text changes, and only
    on finished jobs (a queued or running job still needs its text), so this
    never races a state change: each UPDATE re-checks the job is finished.
    """
    # One look per retention the plans have (a few), each a range of speech_job_text_kept_idx per
    # tenant up to its own cutoff: a cutoff computed per row from the plan's days read every kept text.
    ids: list[Any] = []
    for days, tenants in _text_retentions().items():
        # The tenants as a list of ids, not a join: joined, PostgreSQL may walk a whole index of
        # kept texts in tenant order; given the ids, it probes each tenant's range up to the cutoff.
        due = (
            SynthesisJob.objects.filter(
                status__in=SynthesisJob.FINISHED,
                finished_at__lt=Now() - dt.timedelta(days=days),
                organization_id__in=tenants,
            )
            .exclude(text="")
            .order_by("finished_at")
        )
        ids += due.values_list("id", flat=True)[: limit - len(ids)]
        if len(ids) >= limit:
            break
    if not ids:
        return 0
    with transaction.atomic(durable=True):
        rows = SynthesisJob.objects.filter(id__in=ids, status__in=SynthesisJob.FINISHED).exclude(text="")
        # The instructions are the tenant's own words too, and what could not be applied of them
        # quotes them ("unrecognised instruction: ..."): they go with the text.
        worded = list(rows.filter(params__has_key="instructions").only("id", "params"))
        for job in worded:
            job.params = {name: value for name, value in job.params.items() if name != "instructions"}
        SynthesisJob.objects.bulk_update(worded, ["params"])
        blanked = list(rows.values_list("id", flat=True))
        # The timestamps spell the text out word by word: they go with it (the audio may stay).
        JobTimestamps.objects.filter(job_id__in=blanked).delete()
        return SynthesisJob.objects.filter(id__in=blanked).update(
            text="", applied_instructions={}, timestamps_bytes=0
        )


def _text_retentions() -> dict[int, list[Any]]:
    """The tenants of each text retention (days) the plans have, shortest first."""
    tenants: dict[int, list[Any]] = {}
    rows = Organization.objects.filter(plan__text_retention_days__isnull=False).values_list(
        "plan__text_retention_days", "id"
    )
    for days, tenant in rows.order_by("plan__text_retention_days"):
        if days is not None:
            tenants.setdefault(days, []).append(tenant)
    return tenants
