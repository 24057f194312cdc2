"""Capacity kept for interactive work, and admission to it.

**Admission** (:func:`admit`): a new realtime session or context and a streamed
/v1/audio/speech request are refused at once, ``429 interactive_lane_full``,
while the engine's queued interactive jobs number ``TTS_INTERACTIVE_QUEUE_PER_CHILD`` per child
serving it (at least one child counted): work admitted then would wait behind them, and an agent
is better served by a fast "no" it can route around than by audio seconds late. Units of
sessions already open are not refused: the session was admitted.

**Reserved job slots**: how many of an engine's job slots batch jobs may hold.

A child runs one job at a time, or a group of them when it batches (a GPU child: up to
``TTS_WORKER_BATCH_JOBS``); those are its job slots, which its heartbeat reports. With
``TTS_WORKER_INTERACTIVE_RESERVED`` = r > 0 (default 1), batch jobs of an engine run in at most
(the job slots serving it - r) at once, never fewer than one (batch work always progresses): the
r others stay free for interactive work (a realtime session's unit, a /v1/audio/speech request),
which then starts as soon as it is queued instead of after a batch job ends. Counting slots
rather than children keeps a batching child's batches: one reserved slot of its eight leaves
batch work seven. The slots are counted from the heartbeats; the running batch jobs from the
rows, under a lock per engine in the claim itself (``lifecycle.claim_next``), so concurrent
claimers cannot pass the cap.

A batch message that finds the batch share full claims nothing and is spent. So that its job is
not left waiting for the lost-delivery sweep (``dispatch.resend_lost``, minutes), the refusal is
noted in Redis and the child that ends a batch job of that engine then wakes the queue once more
for the oldest queued batch job (:func:`pass_on`): one message for each slot that frees. If Redis
loses the note, the sweep still re-sends what the queue lacks.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.errors import DomainError, ErrorCode
from webapp.speech.models import SynthesisJob
from webapp.speech.services import dispatch, eta

log = logging.getLogger(__name__)

REFUSED_KEY = "tts:lanes:batch_refused:"


def batch_slots(engine: str, workers: list[dict[str, Any]] | None = None) -> int | None:
    """The job slots ``engine``'s batch jobs may hold at once; None: no cap (nothing reserved)."""
    reserved = settings.TTS_WORKER_INTERACTIVE_RESERVED
    if reserved <= 0:
        return None
    return max(1, eta.serving_slots(engine, workers) - reserved)


def note_refused(engine: str) -> None:
    """A batch message of ``engine`` was spent without a claim: the next batch job's end passes one on."""
    try:
        redis_clients.locks().set(REFUSED_KEY + engine, "1", ex=settings.TTS_JOB_REDELIVER_SECONDS)
    except RedisError as exc:
        log.warning("could not note a refused batch message of %s (the sweep re-sends it): %s", engine, exc)


def pass_on(engine: str) -> bool:
    """After a batch job of ``engine`` ended: while batch messages have been refused, wake the queue
    for the oldest queued batch job; whether a message was sent."""
    try:
        if not redis_clients.locks().exists(REFUSED_KEY + engine):
            return False
    except RedisError:
        return False
    oldest = (
        SynthesisJob.objects.filter(
            status=SynthesisJob.Status.QUEUED, engine=engine, lane=SynthesisJob.Lane.BATCH
        )
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
    )
    if oldest is None:
        try:
            redis_clients.locks().delete(REFUSED_KEY + engine)
        except RedisError:
            pass
        return False
    return dispatch.dispatch_job(oldest)


ADMISSION_RETRY_AFTER = 1  # seconds: a unit takes about that long; the agent may route elsewhere now


def admit(engine: str, workers: list[dict[str, Any]] | None = None) -> None:
    """Refuse new interactive work of ``engine`` while its lane is full (``429 interactive_lane_full``)."""
    children = max(1, sum(eta.serving_children(engine, workers).values()))
    limit = settings.TTS_INTERACTIVE_QUEUE_PER_CHILD * children
    waiting = SynthesisJob.objects.filter(
        status=SynthesisJob.Status.QUEUED, engine=engine, lane=SynthesisJob.Lane.INTERACTIVE
    ).count()
    if waiting >= limit:
        raise DomainError(
            ErrorCode.INTERACTIVE_LANE_FULL,
            f"Model {engine} has {waiting} interactive requests waiting for {children} worker "
            f"{'child' if children == 1 else 'children'}; try again shortly or elsewhere.",
            retry_after=ADMISSION_RETRY_AFTER,
        )
