"""The dispatch port: Celery messages for queued jobs and uploaded voices, sent by task name.

Services never import the task modules (``webapp.speech.tasks`` sits above them):
a message is sent by its task's name, and the worker that consumes the queue
has the task registered under that name.

The job row is the outbox: a job is created ``queued`` with ``dispatched_at``
null, its message is sent once the creating transaction commits, and beat
re-sends what was never sent (``redispatch_undispatched``) or was lost after
sending (:func:`resend_lost`, run by beat). A message is a wake-up: the
worker that takes it claims the fairest queued job of its engines, which may
be another one (``lifecycle.claim_next``); the row stays the truth.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.celery import app
from webapp.speech.models import SynthesisJob

log = logging.getLogger(__name__)

Status = SynthesisJob.Status

# The task names the worker registers (webapp/speech/tasks.py) and the analysis queue.
SYNTHESIZE_JOB = "speech.synthesize_job"
ANALYSE_VOICE = "speech.analyse_voice"
EMBED_CONSENT = "speech.embed_consent"
ANALYSIS_QUEUE = "analysis"


def queue_for_engine(engine: str) -> str:
    return f"synth.{engine}"


def scales_to_zero(engine: str) -> bool:
    """Whether the engine's queue is served by a pool that may have no worker now (``TTS_SCALE_TO_ZERO_QUEUES``)."""
    return queue_for_engine(engine) in settings.TTS_SCALE_TO_ZERO_QUEUES


def job_time_limits(text_chars: int) -> tuple[float, float]:
    """(soft, hard) seconds for a job, both growing with its text length.

    soft: a budget of the child's CPU time (per inference thread) =
    TTS_JOB_BASE_SECONDS + TTS_JOB_SECONDS_PER_CHAR x characters, capped by
    TTS_MAX_JOB_SECONDS; the worker stops at the first sentence past it. CPU
    time, not wall time: a busy host slows a job without using up its budget.
    hard: the wall-clock ceiling, the row's deadline = soft x
    TTS_JOB_WALL_FACTOR (the slack a busy host gets), capped by
    TTS_MAX_JOB_SECONDS, + TTS_JOB_HARD_GRACE_SECONDS.
    """
    soft = min(
        settings.TTS_JOB_BASE_SECONDS + settings.TTS_JOB_SECONDS_PER_CHAR * text_chars,
        settings.TTS_MAX_JOB_SECONDS,
    )
    wall = min(soft * settings.TTS_JOB_WALL_FACTOR, settings.TTS_MAX_JOB_SECONDS)
    return float(soft), float(wall + settings.TTS_JOB_HARD_GRACE_SECONDS)


def celery_time_limit() -> int:
    """The one Celery hard limit of every synthesis message: above any job's deadline.

    A message may claim another job than its own (fair claims), so Celery's
    limit cannot be the job's; it only kills a child stuck where Python cannot
    stop it (the worker's own alarm fires at the job's hard limit first).
    """
    return int(settings.TTS_MAX_JOB_SECONDS + 2 * settings.TTS_JOB_HARD_GRACE_SECONDS)


def _send(job_id: Any, engine: str | None = None, text_chars: int | None = None) -> bool:
    # Sent whatever the job's status now: a message is a wake-up for the engine's queue,
    # not for this job alone. Claims take the fairest job, so an earlier message may
    # already have claimed this one while its own job waits; skipping this message
    # would leave that job with none until the lost-delivery sweep (minutes). A
    # message that finds nothing to claim costs the worker one query.
    if engine is None or text_chars is None:
        row = (
            SynthesisJob.objects.filter(id=job_id)
            .values_list("engine", Coalesce("synth_chars", "text_chars"))
            .first()
        )
        if row is None:
            return False
        engine, text_chars = row
    # This job's limits travel with its message (the worker applies them when it claims
    # this job); Celery's own limit is one ceiling for all.
    soft, hard = job_time_limits(text_chars)
    try:
        app.send_task(
            SYNTHESIZE_JOB,
            args=(str(job_id),),
            kwargs={"limits": [soft, hard]},
            queue=queue_for_engine(engine),
            time_limit=celery_time_limit(),
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.2},
        )
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("dispatch of job %s failed, beat will retry: %s", job_id, exc)
        return False
    SynthesisJob.objects.filter(id=job_id).update(dispatched_at=timezone.now())
    return True


def messages_waiting(engine: str) -> int | None:
    """How many messages wait in the engine's queue in the broker; None when it cannot be asked.

    Each waiting message will wake a worker that claims one queued job of the
    engine (any one, the fairest), so the lost-delivery sweep sends only what
    the queue lacks (:func:`resend_lost`). Celery sends no
    priority, so the queue is the one Redis list of that name.
    """
    try:
        with app.connection_or_acquire() as connection:
            return int(connection.default_channel.client.llen(queue_for_engine(engine)))
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("could not count the messages of queue %s: %s", queue_for_engine(engine), exc)
        return None


def dispatch_job(job_id: Any, engine: str | None = None, text_chars: int | None = None) -> bool:
    """Send the job's message to its engine queue and mark it dispatched (run after commit).

    ``engine`` and ``text_chars``: the job's own, when the caller has them (the
    submit that just created it), which spares reading the row again.
    A failure to reach the broker is logged, not raised: the job stays
    undispatched and beat sends it again.
    """
    return _send(job_id, engine, text_chars)


def redispatch_undispatched(older_than_seconds: int | None = None, limit: int = 500) -> int:
    """Send the messages of queued jobs that were never sent (the broker was down at submit)."""
    grace = settings.TTS_DISPATCH_GRACE_SECONDS if older_than_seconds is None else older_than_seconds
    cutoff = timezone.now() - dt.timedelta(seconds=grace)
    ids = list(
        SynthesisJob.objects.filter(status=Status.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    return sum(1 for job_id in ids if _send(job_id))


def send_analysis(voice_pk: Any) -> bool:
    """Queue the analysis of an uploaded voice (after commit).

    A broker failure leaves the voice ``processing``; housekeeping's
    reject_stale_voices ends it with a reason.
    """
    limit = settings.TTS_ANALYSIS_TIME_LIMIT_SECONDS
    try:
        app.send_task(
            ANALYSE_VOICE,
            args=(str(voice_pk),),
            queue=ANALYSIS_QUEUE,
            soft_time_limit=int(limit * 0.8),
            time_limit=limit,
        )
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("could not queue the analysis of voice %s: %s", voice_pk, exc)
        return False
    return True


def send_consent_embedding(consent_pk: Any) -> bool:
    """Queue the speaker embedding of a consent recording (after commit). Lost, it is computed when a
    voice naming the consent is analysed (runtime/analysis.py), or asked for again by an attach."""
    try:
        app.send_task(EMBED_CONSENT, args=(str(consent_pk),), queue=ANALYSIS_QUEUE, time_limit=60)
    except Exception as exc:  # kombu/redis errors have no common base worth naming
        log.warning("could not queue the embedding of consent %s: %s", consent_pk, exc)
        return False
    return True


def resend_lost(limit: int = 500) -> int:
    """Send again the message of queued jobs whose message was lost; how many were sent.

    A message is a wake-up for its engine's queue (any waiting message claims
    one queued job of the engine), so a message is lost only where the queue
    holds fewer messages than the engine has dispatched queued jobs: that many
    jobs, those dispatched longest ago (more than TTS_JOB_REDELIVER_SECONDS,
    ``dispatched_at`` then moves on), get theirs again. The broker is asked, not
    a marker of ours: a purge, a Redis restarted without its last writes, a
    worker that died holding a message all show as a shorter queue, and a
    backlog with no worker keeps one message per job, never more. A duplicate
    (a message a worker holds but has not claimed with yet) is harmless: the
    claim is conditional.
    """
    cutoff = timezone.now() - dt.timedelta(seconds=settings.TTS_JOB_REDELIVER_SECONDS)
    dispatched = SynthesisJob.objects.filter(status=SynthesisJob.Status.QUEUED, dispatched_at__isnull=False)
    lost: list[Any] = []
    per_engine = dispatched.values_list("engine").annotate(jobs=Count("id")).order_by("engine")
    for engine, jobs in per_engine:
        waiting = messages_waiting(engine)
        missing = 0 if waiting is None else min(jobs - waiting, limit - len(lost))
        if missing > 0:
            lost += (
                dispatched.filter(engine=engine, dispatched_at__lt=cutoff)
                .order_by("dispatched_at")
                .values_list("id", flat=True)[:missing]
            )
    return sum(1 for job_id in lost if dispatch_job(job_id))
