"""Exactly one attempt owns a job: a stale attempt (a live owner whose lease ran out) can do no harm.

Each claim gets a fencing token; every worker write carries it and each
attempt writes only files named with its own token. The first test races two
attempts in this process with real audio; the others freeze a real worker
child with SIGSTOP and thaw it while the new attempt runs, in both orders.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import pytest

from tests.reliability.helpers import (
    LONG,
    PIPER,
    SHORT,
    children,
    flush_queues,
    job,
    make_org,
    media_root,
    partial_files,
    start_worker,
    submit,
    usage_events,
    wait_status,
    wait_until,
)
from tests.stack import TestStack
from webapp.errors import JobFailureCode

pytestmark = pytest.mark.django_db(transaction=True)


def _expire_lease(job_id: Any) -> None:
    """The owner's lease runs out now (database clock), as after a long pause of its process."""
    from django.db import connection

    from webapp.speech.models import SynthesisJob

    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {SynthesisJob._meta.db_table} SET lease_until = now() - interval '1 second' WHERE id = %s",
            [str(job_id)],
        )


def _folder(org: Any) -> str:
    return os.path.join(media_root(), "audio", str(org.id))


def _complete(claimed: Any, relative: str, result: Any) -> bool:
    from webapp.speech import lifecycle

    return lifecycle.complete_job(
        claimed.id,
        claimed.claim_token,
        audio_path=relative,
        audio_bytes=result.bytes,
        duration_seconds=result.duration_seconds,
        metrics={},
        applied_instructions={},
    )


class _Lost(Exception):
    """A fenced progress write of this attempt matched no row (as the runtime's AttemptLost)."""


def _run_attempt(
    synthesizer: Any, claimed: Any, text: str, meet: threading.Barrier, seen: list[list[str]]
) -> Any:
    """One attempt in its own thread, writing its own file with fenced progress, as the runtime does.

    At its first sentence it waits for the other attempt there too: both are writing at once.
    """
    from django.db import connection

    from synth import SynthesisRequest
    from webapp.speech import lifecycle
    from webapp.speech.services import files, outputs

    relative = outputs.attempt_path(claimed)
    out = files.media_path(relative)
    os.makedirs(os.path.dirname(out), exist_ok=True)

    def progress(done: int, total: int) -> None:
        if done == 1:
            meet.wait(60)  # both attempts have a sentence in their own partial file now
            seen.append(sorted(os.listdir(os.path.dirname(out))))
        if lifecycle.report_progress(claimed.id, claimed.claim_token, done, total) is lifecycle.Verdict.LOST:
            raise _Lost()

    try:
        result = synthesizer.synthesize(SynthesisRequest(text=text, voice=PIPER, format="wav"), out, progress)
    except _Lost:
        outputs.discard_output(claimed.id, claimed.claim_token, relative)
        return None
    finally:
        connection.close()
    return relative, result, _complete(claimed, relative, result)


def test_two_attempts_racing_leave_one_file_the_right_one_charged_once(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    from synth import Synthesizer
    from webapp.speech import lifecycle

    org = make_org("race")
    text = "Two attempts race for it. " + " ".join(LONG.split(". ")[:2])
    j = submit(org, text, voice=PIPER)
    stale = lifecycle.claim_job(j.id, "node-a:ns-1:101")
    assert stale is not None and stale.attempts == 1
    _expire_lease(j.id)  # owner A is alive but paused; the reaper gives the job to another run
    assert lifecycle.requeue_expired_leases()[0] == 1
    live = lifecycle.claim_job(j.id, "node-b:ns-2:202")
    assert live is not None and live.claim_token > stale.claim_token
    synthesizer = Synthesizer(engines=["piper"])
    synthesizer.load()
    meet, seen = threading.Barrier(2), list[list[str]]()
    # Both run at the same time, each in its own thread, into its own file.
    with ThreadPoolExecutor(2) as pool:
        stale_run = pool.submit(_run_attempt, synthesizer, stale, text, meet, seen)
        live_run = pool.submit(_run_attempt, synthesizer, live, text, meet, seen)
        stale_outcome, live_outcome = stale_run.result(120), live_run.result(120)
    # They overlapped: at the meeting point both partial files were there, side by side.
    for listing in seen:
        assert {f.split(".")[2] for f in listing if f.endswith(".part") and "stream" not in f} == {
            str(stale.claim_token),
            str(live.claim_token),
        }
    # The stale attempt learned it lost the job at its first write and published nothing.
    assert stale_outcome is None
    live_path, live_result, published = live_outcome
    assert published
    # Late writes of the stale attempt change nothing.
    assert not lifecycle.fail_job(j.id, JobFailureCode.STORAGE_ERROR, "late failure", token=stale.claim_token)
    assert not lifecycle.requeue_job(j.id, stale.claim_token, reason="late")
    row = job(j.id)
    assert (row.status, row.audio_path, row.attempts) == ("succeeded", live_path, 2)
    assert os.listdir(_folder(org)) == [os.path.basename(live_path)]
    assert os.path.getsize(os.path.join(media_root(), live_path)) == row.audio_bytes == live_result.bytes > 0
    assert usage_events(j.id) == ["charge", "reserve"]


def _dead_owner() -> str:
    """A worker id of this host whose process has exited: its job's owner is known dead."""
    from webapp.speech import owners

    gone = subprocess.Popen(["true"])
    gone.wait()
    return f"{socket.gethostname()}:{owners._pid_namespace()}-0-dead00:{gone.pid}"


def test_a_rival_that_claims_a_dead_owners_job_first_keeps_its_files(
    stack: TestStack, builtin_voices: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries find the job's owner dead; a real worker claims first and writes, the
    other's claim then fails: it removes the dead owner's files, never the rival's."""
    from webapp.speech import lifecycle
    from webapp.speech.runtime import claims, worker
    from webapp.speech.services import files, outputs

    flush_queues(stack, "synth.piper")
    org = make_org("rival")
    j = submit(org, LONG, voice=PIPER)
    dead = lifecycle.claim_job(j.id, _dead_owner())
    assert dead is not None and dead.attempts == 1
    # What the dead owner left: its audio renamed into place and its stream file.
    dead_audio = files.media_path(outputs.attempt_path(dead))
    os.makedirs(os.path.dirname(dead_audio), exist_ok=True)
    for path in (dead_audio, os.path.join(_folder(org), f".{os.path.basename(dead_audio)}.stream.part")):
        with open(path, "wb") as fh:
            fh.write(b"left by the dead owner")

    real_claim = lifecycle.claim_job
    read_the_row, at_claim, after_claim = threading.Event(), [], []

    def claim_after_the_rival(job_id: Any, *args: Any, **kwargs: Any) -> Any:
        # This delivery read the row (dead owner, its token) before the rival claimed; its own
        # claim comes while the rival's attempt (the next token) is writing.
        read_the_row.set()
        wait_until(lambda: job(j.id).attempts == 2 and job(j.id).progress > 0, 90, "the rival writing")
        at_claim.extend(partial_files(_folder(org)))
        return real_claim(job_id, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "claim_job", claim_after_the_rival)
    state: Any = worker.WorkerState()

    def deliver() -> None:
        from django.db import connection

        try:
            assert claims._claim(state, str(j.id)) is None  # the rival owns it now
            after_claim.extend(partial_files(_folder(org)))
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        delivery = pool.submit(deliver)
        assert read_the_row.wait(30)
        rival = start_worker(stack, "w-rival", engines="piper")
        try:
            delivery.result(120)
            rival_token = job(j.id).claim_token
            rival_files = [f for f in at_claim if f".{j.id}.{rival_token}." in f]
            assert rival_files, at_claim  # the rival was writing when the failed claim cleaned up
            assert set(rival_files) <= set(after_claim), (rival_files, after_claim)
            assert not os.path.exists(dead_audio)  # the dead owner's files are gone
            assert not [f for f in after_claim if f".{j.id}.{dead.claim_token}." in f], after_claim
            (row,) = wait_status([j.id], timeout=120)
        finally:
            stack.stop_service(rival)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.attempts == 2 and row.claim_token == rival_token
    assert os.path.getsize(os.path.join(media_root(), row.audio_path)) == row.audio_bytes > 0
    assert usage_events(j.id) == ["charge", "reserve"]


def _frozen_owner(j: Any, worker: Any, at_progress: float) -> psutil.Process:
    """SIGSTOP the child running ``j`` once it reaches ``at_progress``."""
    wait_until(lambda: job(j.id).progress >= at_progress, 90, f"the job at {at_progress:.0%}", 0.02)
    owner = job(j.id).worker
    victim = psutil.Process(int(owner.rpartition(":")[2]))
    assert victim.pid in {p.pid for p in children(worker)}
    victim.send_signal(signal.SIGSTOP)
    wait_until(lambda: victim.status() == psutil.STATUS_STOPPED, 10, "the child to stop")
    return victim


def _hand_to_the_other_child(j: Any, victim: psutil.Process) -> None:
    """The frozen owner's lease runs out; the reaper re-queues and the other child claims (the next token)."""
    from webapp.speech import lifecycle

    first = job(j.id).claim_token
    _expire_lease(j.id)
    assert lifecycle.requeue_expired_leases()[0] == 1
    wait_until(
        lambda: job(j.id).claim_token > first and job(j.id).status == "running",
        60,
        "the second attempt to start",
    )
    assert not job(j.id).worker.endswith(f":{victim.pid}")


def _assert_one_good_result(org: Any, j: Any) -> Any:
    (row,) = wait_status([j.id], timeout=120)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.attempts == 2 and f".{row.claim_token}." in row.audio_path
    assert usage_events(j.id) == ["charge", "reserve"]
    folder = _folder(org)
    wait_until(lambda: not partial_files(folder), 10, "no partial files")
    assert os.listdir(folder) == [os.path.basename(row.audio_path)]
    assert os.path.getsize(os.path.join(media_root(), row.audio_path)) == row.audio_bytes > 0
    return row


def test_frozen_child_thawed_while_the_new_attempt_runs_stops_at_once(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    worker = start_worker(stack, "w-fence-a", engines="piper", concurrency=2)
    try:
        org = make_org("fence-notice")
        j = submit(org, " ".join([LONG] * 2), voice=PIPER)
        victim = _frozen_owner(j, worker, 0.4)
        frozen_stage = job(j.id).stage
        _hand_to_the_other_child(j, victim)
        wait_until(lambda: job(j.id).progress >= 0.05, 60, "the new attempt at 5 %", 0.02)
        thawed = time.time()
        victim.send_signal(signal.SIGCONT)
        # The stale attempt's next progress write matches no row: it stops before its next
        # sentence, long before the new attempt is done, and its child is free again.
        wait_until(
            lambda: [
                b
                for b in stack.heartbeats()
                if b.get("pid") == victim.pid and b.get("current_job") is None and b.get("at", 0) > thawed
            ],
            10,
            "the thawed child to drop the job",
        )
        assert job(j.id).status == "running" and job(j.id).progress < 1.0
        row = _assert_one_good_result(org, j)
        assert row.metrics["pid"] != victim.pid and frozen_stage.startswith("synthesising")
    finally:
        stack.stop_service(worker)


def test_frozen_child_that_finishes_first_publishes_nothing(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    flush_queues(stack, "synth.piper")
    marker = "#pause-before-commit#"
    worker = start_worker(
        stack, "w-fence-b", engines="piper", concurrency=2, TTS_FAULT_PAUSE_BEFORE_COMMIT_MARKER=marker
    )
    try:
        org = make_org("fence-finish")
        j = submit(org, f"{LONG} {marker}", voice=PIPER)
        # The first attempt wrote its whole file and stops itself just before it commits.
        owner = wait_until(
            lambda: [p for p in children(worker) if p.status() == psutil.STATUS_STOPPED], 90, "the pause"
        )[0]
        assert job(j.id).worker.endswith(f":{owner.pid}") and job(j.id).status == "running"
        _hand_to_the_other_child(j, owner)
        wait_until(lambda: job(j.id).progress >= 0.05, 60, "the new attempt at 5 %", 0.02)
        owner.send_signal(signal.SIGCONT)  # the stale run tries to publish first
        row = _assert_one_good_result(org, j)
        assert row.metrics["pid"] != owner.pid
    finally:
        stack.stop_service(worker)


def test_sigkill_between_rename_and_commit_ends_succeeded_with_a_complete_file(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    import soundfile

    flush_queues(stack, "synth.espeak")
    marker = "#die-before-commit#"
    worker = start_worker(stack, "w-fence-kill", TTS_FAULT_CRASH_BEFORE_COMMIT_MARKER=marker)
    try:
        org = make_org("fence-kill")
        j = submit(org, f"{SHORT} {marker}")
        (row,) = wait_status([j.id], timeout=60)
        assert row.status == "succeeded", (row.error_code, row.error_message)
        # The first attempt renamed its file into place and died before its commit;
        # the redelivered message re-claimed the job from the dead owner.
        assert row.attempts == 2 and f".{row.claim_token}." in row.audio_path
        path = os.path.join(media_root(), row.audio_path)
        info = soundfile.info(path)
        assert os.path.getsize(path) == row.audio_bytes > 0
        assert info.frames / info.samplerate == pytest.approx(row.duration_seconds, abs=0.01)
        assert usage_events(j.id) == ["charge", "reserve"]
        # The dead attempt's file is gone too (its owner is known dead), nothing half-written stays.
        assert os.listdir(_folder(org)) == [os.path.basename(row.audio_path)]
    finally:
        stack.stop_service(worker)


def test_a_claim_whose_commit_a_failover_lost_leaves_no_token_for_the_next_claimer(
    stack: TestStack, builtin_voices: list[str]
) -> None:
    """A promoted replica lacks the last committed claim: the row reads as before it, while
    that claim's owner runs on. The next claim must not be handed the owner's token (with
    it, the owner's file names and its writes)."""
    from django.db import connection

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import outputs

    org = make_org("failover")
    j = submit(org, SHORT)
    before = SynthesisJob.objects.values("status", "claim_token", "attempts").get(pk=j.id)
    ghost = lifecycle.claim_job(j.id, "node-a:ns-1:101")
    assert ghost is not None
    time.sleep(0.01)  # the promoted replica's clock has moved on from the lost claim's
    with connection.cursor() as cursor:  # the failover: the row as the replica has it
        cursor.execute(
            f"UPDATE {SynthesisJob._meta.db_table} SET status = %s, claim_token = %s, attempts = %s,"
            " worker = '' WHERE id = %s",
            [before["status"], before["claim_token"], before["attempts"], str(j.id)],
        )
    live = lifecycle.claim_job(j.id, "node-b:ns-2:202")
    assert live is not None and live.claim_token > ghost.claim_token
    assert outputs.attempt_path(live) != outputs.attempt_path(ghost)
    # The ghost's writes are refused; the live attempt's go through.
    assert lifecycle.report_progress(j.id, ghost.claim_token, 1, 2) is lifecycle.Verdict.LOST
    assert lifecycle.report_progress(j.id, live.claim_token, 1, 2) is not lifecycle.Verdict.LOST
