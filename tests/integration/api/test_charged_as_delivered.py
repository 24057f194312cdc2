"""Charge only what was delivered, never twice (issues 31 and 32).

Through Nginx (TLS), gunicorn and a real worker: a client of /v1/audio/speech
that goes away, or whose web process is killed, leaves no job running to be
charged; the same Idempotency-Key twice is one job and one charge; a native
stream followed by a cancel, a delete or a reconnect charges the sentences the
streams handed out, once; audio far longer than its characters (speed 0.25) is
charged by its seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Any

import psutil
import pytest
import requests

from tests.integration.api.conftest import base_url

# Sentences of similar length: a job that takes many seconds, streamed sentence by sentence.
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a text that keeps the worker busy." for n in range(1, 25)
)
PCM_RATE = 22050  # the streamed PCM of the test voice (16-bit mono)
# The native stream tests read, cancel, reconnect and delete while the job runs: 60 sentences
# take Piper about 11 s on an idle machine (24 took 4.5 s, and the job could end before the test).
STREAMED_TEXT = " ".join(
    f"This is sentence number {n:02d} of a text that keeps the worker busy." for n in range(1, 61)
)  # sentences of one length: n of them hold n/60 of the characters


def _post_openai(web: Any, key: str, body: dict[str, Any], **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
    return requests.post(
        f"{base_url(web)}/v1/audio/speech", json=body, headers=headers, verify=False, **kwargs
    )


def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _settlement(job_id: Any) -> Any:
    from webapp.speech.models import UsageEvent

    return UsageEvent.objects.exclude(kind=UsageEvent.Kind.RESERVE).filter(job_key=job_id).first()


def _job_of(org: Any) -> Any:
    from webapp.speech.models import SynthesisJob

    _wait_until(lambda: SynthesisJob.objects.filter(organization=org).exists(), 30, "the job")
    return SynthesisJob.objects.get(organization=org)


def _finished(job: Any) -> bool:
    job.refresh_from_db()
    return bool(job.is_finished)


def _running(job: Any) -> bool:
    job.refresh_from_db()
    return bool(job.status == "running")


# --------------------------------------------------------------------- /v1/audio/speech


def test_openai_client_that_leaves_its_wait_ends_the_job_and_pays_nothing(live_tenant: Any, web: Any) -> None:
    t = live_tenant()
    body = {"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "wav"}
    with pytest.raises(requests.exceptions.ReadTimeout):
        _post_openai(web, t.raw_key, body, timeout=(10, 1.5))  # gives up after 1.5 s, closing
    job = _job_of(t.org)
    # The disconnect abandons the job at once: it is settled within seconds, long before the
    # worker could have finished the text (which then would have been charged whole).
    _wait_until(lambda: _settlement(job.id) is not None, 10, "the job's settlement")
    event = _settlement(job.id)
    assert (event.kind, event.characters) == ("release", 0)
    _wait_until(lambda: _finished(job), 60, "the job to end")
    assert job.status == "canceled"


def _gunicorn_workers(web: Any) -> list[psutil.Process]:
    """The web processes of the test stack's gunicorn (the master's children)."""
    # The stack's own gunicorn binds its socket; the environment may not name the folder (only
    # a run with TTS_TEST_VAR_DIR set has it there).
    bind = f"unix:{web.cfg.gunicorn_socket}"
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        try:
            if "gunicorn" in cmdline and bind in cmdline:
                parent = proc.parent()
                if parent is not None and "gunicorn" not in " ".join(parent.cmdline()):
                    return list(proc.children())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError("no gunicorn master found")


def test_a_waiter_killed_outright_leaves_a_lapsing_lease_the_reaper_ends(live_tenant: Any, web: Any) -> None:
    """The web process is SIGKILLed mid-wait (as after gunicorn's graceful_timeout): no code of
    it runs, its lease is no longer renewed, and the reaper abandons the job once it lapses."""
    from django.conf import settings

    from webapp.speech import lifecycle

    # At a quarter of the speed, four times the audio: still running once the lease has lapsed
    # (at full speed the 48 sentences were done first on a quiet host; OpenAI's input stops at 4096).
    t = live_tenant()
    body = {
        "model": "tts-1",
        "voice": "alloy",
        "input": LONG_TEXT * 2,
        "response_format": "wav",
        "speed": 0.25,
    }
    answers: list[int] = []
    waiting = threading.Thread(
        target=lambda: answers.append(_post_openai(web, t.raw_key, body, timeout=60).status_code)
    )
    waiting.start()
    job = _job_of(t.org)
    _wait_until(lambda: _running(job), 30, "the job to run")
    time.sleep(settings.TTS_WAITER_LEASE_SECONDS + 1)  # past the lease: only renewals keep it
    assert lifecycle.abandon_lapsed_waiters() == 0, "a connected waiter's lease lapsed"
    for worker in _gunicorn_workers(web):
        os.kill(worker.pid, signal.SIGKILL)  # every web process: whichever one held the wait
    waiting.join(30)
    assert answers and answers[0] == 502  # Nginx: the upstream went away
    job.refresh_from_db()
    assert job.status == "running" and not job.cancel_requested  # nothing ran at the kill
    _wait_until(lambda: lifecycle.reap_running()["abandoned"] == 1, 15, "the lease to lapse")
    event = _settlement(job.id)
    assert (event.kind, event.characters) == ("release", 0)
    job.refresh_from_db()
    # Still running at the lapse: told to stop. Finished in between (a loaded machine): its
    # answer left undelivered, the audio expired at once. Either way nothing was charged.
    assert job.cancel_requested or job.status in ("canceled", "expired"), job.status
    # gunicorn's master has started new web processes: the site serves again.
    _wait_until(lambda: _healthy(web), 30, "the web tier to be back")


def _healthy(web: Any) -> bool:
    try:
        return requests.get(f"{base_url(web)}/healthz", verify=False, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_a_queued_job_whose_waiter_died_is_abandoned_once_its_lease_lapses(
    make_tenant: Any, builtin_voices: list[str]
) -> None:
    """A job still queued (its message lost, or no worker free) when its waiter died."""
    import datetime as dt

    from django.utils import timezone

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, Voice

    t = make_tenant()  # no worker, and no message sent: the jobs stay queued

    def submit(text: str, waited: bool) -> Any:
        voice = Voice.objects.get(voice_id="espeak-en-us", organization__isnull=True)
        request = lifecycle.JobRequest(
            text=text,
            voice=voice,
            format="wav",
            sample_rate=None,
            params={},
            billable_chars=len(text),
            waited=waited,
        )
        return lifecycle.submit_job(t.org, request)[0]

    waited, plain = submit("a waited job", True), submit("a plain job", False)
    assert waited.waiter_until is not None and plain.waiter_until is None
    assert lifecycle.abandon_lapsed_waiters() == 0  # the lease taken at submit holds
    past = timezone.now() - dt.timedelta(seconds=1)
    SynthesisJob.objects.filter(id=waited.id).update(waiter_until=past)  # never renewed since
    assert lifecycle.abandon_lapsed_waiters() == 1
    waited.refresh_from_db()
    assert waited.status == "canceled"
    event = _settlement(waited.id)
    assert (event.kind, event.characters) == ("release", 0)
    plain.refresh_from_db()
    assert plain.status == "queued"  # no waiter, no lease: never abandoned
    assert lifecycle.abandon_lapsed_waiters() == 0


def test_the_same_idempotency_key_twice_is_one_job_and_one_charge(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod

    t = live_tenant()
    body = {
        "model": "tts-1",
        "voice": "alloy",
        "input": "Said once, asked for twice.",
        "response_format": "wav",
    }
    key = {"Idempotency-Key": "retry-after-a-lost-answer"}
    first = _post_openai(web, t.raw_key, body, headers=key, timeout=60)
    again = _post_openai(web, t.raw_key, body, headers=key, timeout=60)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    job = SynthesisJob.objects.get(organization=t.org)
    charges = UsageEvent.objects.filter(job_key=job.id, kind="charge")
    # Settled as its answer was handed: a moment after the client may have read it all.
    _wait_until(charges.exists, 10, "the answer's settlement")
    assert [c.characters for c in charges] == [job.text_chars]
    assert UsagePeriod.objects.get(organization=t.org).characters_used == job.text_chars
    other = _post_openai(web, t.raw_key, {**body, "input": "Something else."}, headers=key, timeout=60)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    # No key, no replay: the route derives none by itself.
    assert _post_openai(web, t.raw_key, body, timeout=60).status_code == 200
    assert SynthesisJob.objects.filter(organization=t.org).count() == 2


def test_a_failing_dispatch_after_commit_is_not_a_500(
    live_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected fault: the after-commit dispatch raises (not a broker error it already catches)."""
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import dispatch

    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("injected: dispatch broke after the commit")

    monkeypatch.setattr(dispatch, "_send", broken)
    t = live_tenant()
    t.client.client.raise_request_exception = False
    response = t.client.post("/api/v1/speech", {"text": "Committed all the same.", "voice": "espeak-en-us"})
    assert response.status_code == 202, response.content
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "queued" and job.dispatched_at is None  # beat's redispatch sends it


# --------------------------------------------------------------------- /api/v1/speech/{id}/stream


def _native_job(web: Any, key: str, text: str = STREAMED_TEXT) -> str:
    r = requests.post(
        f"{base_url(web)}/api/v1/speech",
        json={"text": text, "voice": "en_US-joe-medium", "format": "pcm"},
        headers={"Authorization": f"Bearer {key}"},
        verify=False,
        timeout=30,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _open_stream(web: Any, key: str, job_id: str) -> requests.Response:
    r = requests.get(
        f"{base_url(web)}/api/v1/speech/{job_id}/stream",
        headers={"Authorization": f"Bearer {key}"},
        verify=False,
        stream=True,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r


def _read(response: requests.Response, at_least: int) -> int:
    got = 0
    for chunk in response.iter_content(chunk_size=None):
        got += len(chunk)
        if got >= at_least:
            break
    return got


def _api(web: Any, key: str, method: str, path: str) -> requests.Response:
    return requests.request(
        method,
        f"{base_url(web)}/api/v1/speech/{path}",
        headers={"Authorization": f"Bearer {key}"},
        verify=False,
        timeout=30,
    )


def test_stream_then_cancel_charges_the_sentences_delivered(live_tenant: Any, web: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    job_id, stream = _three_sentences_streamed(web, t.raw_key)
    assert _api(web, t.raw_key, "POST", f"{job_id}/cancel").status_code in (200, 202)
    time.sleep(1)  # the worker stops at its next sentence; the stream still open meanwhile
    stream.close()
    job = SynthesisJob.objects.get(id=job_id)
    _wait_until(lambda: _finished(job), 60, "the job to end")
    assert job.status == "canceled"
    _assert_charged_what_was_delivered(job, t.org)


def _three_sentences_streamed(web: Any, key: str) -> tuple[Any, Any]:
    """A running native job, about three of its sentences read from /stream, the stream left open."""
    from webapp.speech.models import SynthesisJob

    job_id = _native_job(web, key)
    stream = _open_stream(web, key, job_id)
    _read(stream, PCM_RATE * 2 * 12)
    # The stream writes what it handed to the row once a sentence more left the web process.
    _wait_until(
        lambda: SynthesisJob.objects.get(id=job_id).delivered_chars > 0, 15, "the delivery on the row"
    )
    return job_id, stream


def _assert_charged_what_was_delivered(job: Any, org: Any) -> None:
    """The job's one settlement charged the sentences its stream handed out, and released the rest."""
    from webapp.speech.models import UsagePeriod

    event = _settlement(job.id)
    assert event.kind == "charge" and 0 < event.characters < job.text_chars
    assert event.characters <= job.delivered_chars  # no more than the stream handed out
    assert event.parts[0] == {"kind": "delivered", "characters": event.characters}
    row = UsagePeriod.objects.get(organization=org)
    assert row.characters_reserved == 0 and row.characters_used == event.characters


def test_stream_then_fail_charges_the_sentences_delivered(live_tenant: Any, web: Any) -> None:
    """A job whose stream handed out sentences and which then failed pays for those sentences.

    The failure is the reaper's ``timeout``, the real path a job past its hard limit takes; the
    only thing the test changes is the deadline (moved into the past while the job runs).
    """
    from django.db.models.functions import Now

    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    job_id, stream = _three_sentences_streamed(web, t.raw_key)
    assert SynthesisJob.objects.filter(id=job_id, status="running").update(deadline=Now()) == 1
    time.sleep(0.1)
    assert lifecycle.reap_running()["timeout"] == 1
    stream.close()
    job = SynthesisJob.objects.get(id=job_id)
    assert (job.status, job.error_code) == ("failed", "timeout")
    _assert_charged_what_was_delivered(job, t.org)


def test_disconnect_reconnect_then_delete_charges_the_sentences_once(live_tenant: Any, web: Any) -> None:
    import math

    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = live_tenant(max_characters_per_request=20_000)
    # Three times the usual text: a quiet host renders the usual one in the seconds this test
    # waits, and the job must still be running when it is deleted.
    text = " ".join(
        f"This is sentence number {n:03d} of a text that keeps the worker busy." for n in range(180)
    )
    job_id = _native_job(web, t.raw_key, text)
    first = _open_stream(web, t.raw_key, job_id)
    _read(first, PCM_RATE * 2 * 14)  # two sentences or more (one is about 4.5 s)
    first.close()  # the client went away: the job goes on, what it was handed is on the row
    # Nginx notices at its next write to the client, a sentence or so later.
    time.sleep(5)
    assert SynthesisJob.objects.get(id=job_id).status == "running"
    again = _open_stream(web, t.raw_key, job_id)  # the same attempt, from its start
    _read(again, PCM_RATE * 2 * 2)  # handed everything made so far, the first stream's sentences too
    again.close()
    time.sleep(1.5)
    job = SynthesisJob.objects.get(id=job_id)
    sentences = text.count(".")
    made = round(job.progress * sentences) + 1  # (the one being written may be streamed already)
    assert _api(web, t.raw_key, "DELETE", job_id).status_code == 204
    event = _settlement(job_id)
    # The second stream was handed sentences the first had been: they count once (the most
    # one stream delivered); added up they would be more than the worker had made.
    assert event.kind == "charge" and job.text_chars * 2 / sentences <= event.characters < job.text_chars
    assert event.characters <= math.ceil(job.text_chars * made / sentences), made
    assert UsagePeriod.objects.get(organization=t.org).characters_used == event.characters


def test_audio_far_longer_than_its_characters_is_charged_by_its_seconds(live_tenant: Any) -> None:
    from django.conf import settings

    from tests.integration.api.conftest import wait_finished

    t = live_tenant()
    text = "Slowly, please."
    r = t.client.post("/api/v1/speech", {"text": text, "voice": "espeak-en-us", "speed": 0.25})
    assert r.status_code == 202, r.content
    job = wait_finished(t.client, r.json()["id"])
    assert job["status"] == "succeeded", job
    event = _settlement(job["id"])
    by_seconds = int(job["duration_seconds"] / settings.TTS_AUDIO_SECONDS_PER_CHAR)
    assert by_seconds > len(text)  # the speed really made the audio long for its text
    assert event.characters == by_seconds
    assert event.parts == [
        {"kind": "fresh", "characters": len(text)},
        {"kind": "audio_seconds", "characters": by_seconds - len(text)},
    ]
    # At the usual speed, the same text costs its characters.
    r = t.client.post("/api/v1/speech", {"text": text, "voice": "espeak-en-us"})
    plain = wait_finished(t.client, r.json()["id"])
    assert _settlement(plain["id"]).characters == len(text)


WHOLE_FILE = {"model": "tts-1", "voice": "alloy", "input": "Answered whole, once.", "response_format": "wav"}


def test_a_whole_file_answer_is_charged_once_its_first_block_is_handed(live_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    # Django's test client returns the answer once the job succeeded, before any of it is read.
    answer = t.client.post("/v1/audio/speech", WHOLE_FILE)
    assert answer.status_code == 200 and answer.streaming
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "succeeded" and job.waiter_until is not None
    assert _settlement(job.id) is None, "charged before its answer was handed"
    # The server takes the first block, sends it and asks for the next: then it is charged.
    blocks = iter(answer.streaming_content)
    first = next(blocks)
    assert first.startswith(b"RIFF") and _settlement(job.id) is None
    rest = list(blocks)
    settled = _settlement(job.id)
    assert (settled.kind, settled.characters) == ("charge", job.text_chars)
    with open(_media(job), "rb") as stored:
        assert b"".join([first, *rest]) == stored.read()
    job.refresh_from_db()
    assert job.waiter_until is None and job.status == "succeeded"


def test_a_plan_keeping_no_audio_still_charges_the_answer_it_hands(live_tenant: Any) -> None:
    """retention_days=0: the audio is due to expire as it is published. Housekeeping expired it under
    the client still being handed it; the answer then settled nothing, and its reservation stayed."""
    from webapp.housekeeping.catalog import run_job
    from webapp.speech.models import SynthesisJob, UsagePeriod

    t = live_tenant(retention_days=0)
    answer = t.client.post("/v1/audio/speech", WHOLE_FILE)
    assert answer.status_code == 200
    job = SynthesisJob.objects.get(organization=t.org)
    assert job.status == "succeeded" and job.waiter_until is not None
    assert job.expires_at is not None and job.finished_at is not None and job.expires_at <= job.finished_at
    run_job("expire_audio")  # due by the plan, while its answer is not handed yet
    job.refresh_from_db()
    assert job.status == "succeeded", "expired under the client being handed it"
    body = b"".join(answer.streaming_content)
    assert body.startswith(b"RIFF")
    settled = _settlement(job.id)
    assert settled is not None and (settled.kind, settled.characters) == ("charge", job.text_chars)
    period = UsagePeriod.objects.get(organization=t.org)
    assert (period.characters_reserved, period.characters_used) == (0, job.text_chars)
    # Handed and settled: now it goes, as the plan says.
    run_job("expire_audio")
    job.refresh_from_db()
    assert job.status == "expired"


def test_a_waiter_gone_after_its_job_succeeded_but_before_its_answer_pays_nothing(live_tenant: Any) -> None:
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob

    t = live_tenant()
    key = {"HTTP_IDEMPOTENCY_KEY": "left-as-it-finished"}
    answer = t.client.post("/v1/audio/speech", WHOLE_FILE, **key)
    assert answer.status_code == 200
    job = SynthesisJob.objects.get(organization=t.org)
    audio = _media(job)
    answer.close()  # never read: the client went away as its answer was about to be sent
    assert _settlement(job.id) is None
    # Its lease lapses (4 s in tests): the reaper settles it as a client that left.
    _wait_until(lambda: lifecycle.abandon_lapsed_waiters() or _settlement(job.id), 15, "the lease to lapse")
    settled = _settlement(job.id)
    assert (settled.kind, settled.characters) == ("release", 0)
    job.refresh_from_db()
    assert job.status == "expired" and not os.path.exists(audio), "the unpaid audio is still there"
    # A replay of the request cannot fetch what was not paid for.
    replay = t.client.post("/v1/audio/speech", WHOLE_FILE, **key)
    assert replay.status_code >= 400
    assert _settlement(job.id).kind == "release"


def _slow_client(web: Any, key: str, body: dict[str, Any]) -> tuple[socket.socket, int, bytes]:
    """A client of /v1/audio/speech on the web tier's own socket with a tiny receive buffer: the
    socket, the answer's Content-Length and the body bytes read with its headers (it reads no more).

    Straight to gunicorn, as Nginx reaches it: through Nginx, its proxy buffers and two kernels'
    socket buffers absorb more than the first MiB, which hides the web tier's stall this is about.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: little in flight
    sock.settimeout(60)
    sock.connect(str(web.cfg.gunicorn_socket))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{web.cfg.https_port}\r\n"
        "X-Forwarded-Proto: https\r\nX-Real-IP: 127.0.0.1\r\nX-Forwarded-For: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(1024)
        assert chunk, f"closed before the answer's headers: {got!r}"
        got += chunk
    headers, body_start = got.split(b"\r\n\r\n", 1)
    assert headers.startswith(b"HTTP/1.1 200"), headers
    length = next(
        int(line.split(b":")[1])
        for line in headers.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return sock, length, body_start


def test_a_slow_reader_keeps_its_lease_and_pays_for_the_file_it_gets(live_tenant: Any, web: Any) -> None:
    """A client that stops reading its answer holds the server's send of the first block. The lease
    used to stop with the wait: the reaper released the job as the client's, and the file still
    went out whole, free. The answer keeps the lease until the first block settles the job."""
    from django.conf import settings

    from webapp.speech import lifecycle

    t = live_tenant()
    # About 100 s of 24 kHz PCM (4.8 MB): far more than the path from the web process buffers.
    body = {"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "pcm"}
    sock, length, received = _slow_client(web, t.raw_key, body)
    with sock:
        job = _job_of(t.org)
        assert job.status == "succeeded" and length > 2 * 1024 * 1024
        time.sleep(settings.TTS_WAITER_LEASE_SECONDS + 2)  # reads nothing, well past a lease
        assert lifecycle.abandon_lapsed_waiters() == 0, "the reaper released a job whose answer is being sent"
        assert _settlement(job.id) is None  # its first block is still in the web process
        while len(received) < length:
            chunk = sock.recv(256 * 1024)
            assert chunk, f"closed after {len(received)} of {length} bytes"
            received += chunk
    with open(_media(job), "rb") as stored:
        assert received == stored.read()
    _wait_until(lambda: _settlement(job.id) is not None, 10, "the answer's settlement")
    settled = _settlement(job.id)
    assert (settled.kind, settled.characters) == ("charge", job.text_chars)


def _media(job: Any) -> str:
    from webapp.speech.services.files import media_path

    return media_path(job.audio_path)


def test_an_answer_closed_once_its_only_block_went_out_is_charged(
    live_tenant: Any, web: Any, voice: str
) -> None:
    """Django closes an answer when its connection closes, and Nginx closes it once the whole body
    came: for a file of one block, sometimes before the answer was resumed after that block."""
    import asyncio

    from webapp.speech import lifecycle
    from webapp.speech.api.openai import AnswerResponse
    from webapp.speech.models import SynthesisJob, UsageEvent, Voice
    from webapp.speech.submission import submit

    tenant = live_tenant()
    text = "A short answer, in one block."
    request = lifecycle.JobRequest(
        text=text,
        voice=Voice.objects.get(voice_id=voice, organization__isnull=True),
        format="wav",
        sample_rate=None,
        params={},
        billable_chars=len(text),
        waited=True,
    )
    job, _ = submit(tenant.org, request, api_key=tenant.key)
    _wait_until(lambda: _finished(job), 60, "the job")
    job.refresh_from_db()
    assert job.status == SynthesisJob.Status.SUCCEEDED and _settlement(job.id) is None  # its answer is owed

    async def take_the_block_then_close() -> None:
        blocks = AnswerResponse(_media(job), "audio/wav", job.id).__aiter__()
        assert len(await blocks.__anext__()) == os.path.getsize(_media(job))
        await blocks.aclose()  # what Django does to an answer whose connection closed

    asyncio.run(take_the_block_then_close())
    charge = _settlement(job.id)
    assert charge is not None and charge.kind == UsageEvent.Kind.CHARGE and charge.characters == len(text)
