"""A message whose job row is locked for a moment when it arrives still runs that job.

Seen once in `make bench-peer` (1 in ~1,000 requests): the dispatch marks the job
sent (an UPDATE of its row) just after publishing its message; the worker's
claim, ``FOR UPDATE ... SKIP LOCKED``, passed over the row while that UPDATE
held it, found nothing else queued, and dropped the message. The job then had
none until the lost-delivery sweep, minutes later, and the OpenAI request
waiting on it timed out (504).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from tests.reliability.helpers import SHORT, flush_queues, job, make_org, start_worker, submit, wait_until
from tests.stack import TestStack

pytestmark = pytest.mark.django_db(transaction=True)


def _hold_row_lock(job_id: uuid.UUID, locked: threading.Event, release: threading.Event) -> None:
    """What the dispatch's UPDATE does for a moment, held as long as the test needs."""
    from webapp.speech.models import SynthesisJob

    try:
        with transaction.atomic():
            SynthesisJob.objects.select_for_update().filter(id=job_id).exists()
            locked.set()
            release.wait(30)
    finally:
        connection.close()


def test_a_message_waits_for_its_own_job_row_locked_for_a_moment(
    stack: TestStack, builtin_voices: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.celery import app
    from webapp.speech.tasks import synthesize_job

    flush_queues(stack, "synth.espeak")
    send = synthesize_job.apply_async
    with monkeypatch.context() as patch:
        patch.setattr(app, "send_task", lambda *a, **k: None)  # its message is sent below
        queued = submit(make_org("locked-row"), SHORT)
    worker = start_worker(stack, "w-locked-row")
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_row_lock, args=(queued.id, locked, release))
    holder.start()
    try:
        assert locked.wait(10)
        send(args=(str(queued.id),), queue="synth.espeak")
        r = stack.redis_client()
        wait_until(lambda: r.llen("synth.espeak") == 0, 10, "the worker to take the message")
        time.sleep(1)  # the child's claim runs within milliseconds of taking the message
        assert job(queued.id).status == "queued"  # the claim overlapped the lock
    finally:
        release.set()
        holder.join(10)
    try:
        wait_until(lambda: job(queued.id).status == "succeeded", 30, "the job to run once the lock is gone")
        assert job(queued.id).attempts == 1
    finally:
        stack.stop_service(worker)
