"""Streaming a job's audio while it is made (chunked transfer).

The worker appends the audio of its current attempt, as 16-bit PCM records,
to a stream file beside its output (``synth.stream``). A stream here follows
one attempt only: it opens that attempt's stream file once and reads it as it
grows; ``pcm`` and ``wav`` are sent as they are (the same samples the stored
file gets), ``mp3``, ``opus``, ``aac``, ``ulaw`` and ``alaw`` are encoded on the fly. If the row
stops naming that attempt (the worker died and another claimed the job, or
it failed or was canceled), the response is cut off without its closing
chunk: a client sees a broken transfer, never two attempts spliced together.
A finished job streams its stored file.

The same steps run under WSGI (a generator) and ASGI (an async generator
that runs each step in the request's thread), picked by the server.

``SSEJobStream`` is the same stream framed as OpenAI's server-sent events: each
step's audio is one ``speech.audio.delta`` event, so what counts as handed (and
charged) is the same per event as per chunk; after the settlement at its end, a
``speech.audio.done`` event says what the job was charged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request

from synth.audio import StreamResampler, content_type, pcm16_samples
from synth.registry import G711_FORMATS, TELEPHONY_RATES
from synth.stream import StreamReader, stream_path
from webapp.errors import DomainError, ErrorCode
from webapp.speech import lifecycle
from webapp.speech.api.stream_wakeups import POLL_ROW_CHECK_SECONDS, AsyncWakeups, SyncWakeups
from webapp.speech.api.views import TenantAPIView
from webapp.speech.models import JobTimestamps, SynthesisJob
from webapp.speech.services import ledger
from webapp.speech.services.files import media_path
from webapp.speech.services.ledger import reports
from webapp.speech.services.outputs import attempt_path
from webapp.speech.services.waiting import WaitSlot, keep_lease

if TYPE_CHECKING:
    import numpy as np

BLOCK = 64 * 1024
LIVE_CODECS = {"mp3": ("mp3", "libmp3lame"), "ogg": ("ogg", "libopus"), "aac": ("adts", "aac")}
# What LiveEncoder makes: PyAV's codecs, and G.711 companded here (synth.g711) sample by sample.
LIVE_FORMATS = (*LIVE_CODECS, *G711_FORMATS)
STREAMABLE = ("pcm", "wav", *LIVE_FORMATS)
ROW_FIELDS = ("status", "claim_token", "audio_path", "organization_id", "format", "text_chars")


class StreamBroken(Exception):
    """The attempt being streamed is gone: the response ends without its closing chunk."""


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header whose sizes say "unknown" (0xFFFFFFFF), as streaming WAV does."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
        b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", unknown)
    )


class _Sink:
    """Where PyAV writes: an append-only buffer, emptied by ``take``."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class LiveEncoder:
    """Encodes 16-bit PCM to mp3 / Ogg Opus / ADTS AAC (pages flushed every 100 ms) or G.711
    μ-law / A-law as it arrives.

    G.711 is 8 kHz only: PCM of another rate (a session's, a voice's) is resampled first, with the
    resampler the worker's encoder uses (soxr, chunk by chunk without seams). At 8 kHz each
    sample is companded as it comes, so the bytes equal what the worker's ``ulaw``/``alaw`` file
    holds for the same samples.
    """

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.frames = 0
        self.law: str | None = None
        self.resampler: StreamResampler | None = None
        if fmt in G711_FORMATS:
            self.law = fmt
            if sample_rate not in TELEPHONY_RATES:
                self.resampler = StreamResampler(sample_rate, TELEPHONY_RATES[0])
            return
        import av

        container, codec = LIVE_CODECS[fmt]
        self.sink = _Sink()
        options = {"page_duration": "100000", "flush_packets": "1"} if fmt == "ogg" else {}
        self.container: Any = cast(Any, av.open(self.sink, mode="w", format=container, options=options))
        self.stream: Any = cast(Any, self.container.add_stream(codec, rate=sample_rate))
        self.stream.layout = "mono"

    def feed(self, pcm16: bytes) -> bytes:
        import numpy as np

        samples = np.frombuffer(pcm16, dtype="<i2")
        if self.law is not None:
            return self._companded(samples)
        import av

        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.sample_rate, self.frames
            self.frames += int(samples.size)
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        return self.sink.take()

    def _companded(self, samples: np.ndarray, last: bool = False) -> bytes:
        import numpy as np

        from synth import g711

        assert self.law is not None
        self.frames += int(samples.size)
        if self.resampler is not None:
            resampled = self.resampler.process(samples.astype(np.float32) / np.float32(32767.0), last=last)
            # The filter rings past full scale on a clipped input: clip as the worker's encoder does.
            samples = pcm16_samples(np.clip(resampled, -1.0, 1.0))
        return g711.encode(samples, self.law)

    def finish(self) -> bytes:
        if self.law is not None:
            import numpy as np

            # The resampler's filter holds back a few milliseconds until it is told the end.
            return self._companded(np.zeros(0, dtype="<i2"), last=True)
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        return self.sink.take()


WaitSent = Callable[[], Awaitable[bool]]
# The name under which gunicorn's worker (deploy/asgi_worker.py) offers its wait in the ASGI scope.
WAIT_SENT_EXTENSION = "tts.wait_sent"


def server_wait_sent(request: Any) -> WaitSent | None:
    """The server's wait until what a connection was handed left the process (None: it has none,
    as under WSGI or in Django's test client, where a chunk counts as handed once taken)."""
    extensions = (getattr(request, "scope", None) or {}).get("extensions") or {}
    wait = extensions.get(WAIT_SENT_EXTENSION)
    return cast(WaitSent, wait) if callable(wait) else None


async def _ended(wakeups: AsyncWakeups, ending: Callable[[], None]) -> None:
    await wakeups.close()
    await sync_to_async(ending)()


class JobStream:
    """One client's stream of one job: ``step()`` returns what can be sent now, until ``done``."""

    block = BLOCK  # PCM bytes (or stored bytes) a step gives out at most

    def __init__(
        self,
        job_id: Any,
        fmt: str,
        abandon_on_close: bool = False,
        start_within: float | None = None,
        wait_sent: WaitSent | None = None,
        fresh_lease: bool = False,
    ):
        self.job_id = job_id
        self.format = fmt
        self.abandon_on_close = abandon_on_close  # the OpenAI route: the job exists for this client only
        self.start_deadline = None if start_within is None else time.monotonic() + start_within
        self.done = False
        self.token: int | None = None
        self.reader: StreamReader | None = None
        self.stored: BinaryIO | None = None
        self.encoder: LiveEncoder | None = None
        self.read_pcm = 0  # PCM bytes of the attempt read from its stream file
        self.backlog = b""  # of those, not yet given to a step (more than BLOCK arrived at once)
        self.unhanded = 0  # of those, not yet taken by the server (in the last chunk, or the encoder)
        self.delivered = 0  # PCM bytes of the attempt the server took from this stream
        self.recorded: tuple[int, int] = (0, 0)  # (sentences, PCM bytes) handed when last reported
        self.text_chars = 0  # the job's billable characters (its row's, read when the attempt opens)
        # A job this request made starts with a whole waiter lease (lifecycle.submit_job): its first
        # renewal waits a period. Renewing at the first step locked the row just as a worker went to
        # claim it, the claim's SKIP LOCKED passed over it, and the job waited for the lost-message sweep.
        self.next_lease_renewal = (
            time.monotonic() + settings.TTS_WAITER_LEASE_SECONDS / 3 if fresh_lease else 0.0
        )
        # The server's wait until what it was handed left the process, where it offers one (the
        # ASGI extension of deploy/asgi_worker.py): a chunk counts as handed after it.
        self.wait_sent = wait_sent
        self.next_row_check = 0.0
        self.row_check_seconds = POLL_ROW_CHECK_SECONDS  # the iterator sets it from its wake-ups

    @property
    def media_type(self) -> str:
        return content_type(self.format)

    def closing(self) -> bytes:
        """Sent after the stream's normal end and its settlement (nothing for chunked audio)."""
        return b""

    def _row(self) -> dict[str, Any] | None:
        return SynthesisJob.objects.filter(pk=self.job_id).values(*ROW_FIELDS).first()

    def step(self, row_changed: bool = False) -> bytes:
        """What can be sent now; ``row_changed``: the job's state changed, re-read the row."""
        self._record()
        if self.stored is not None:
            return self._stored_block()
        if self.reader is None:
            return self._start()
        # At most BLOCK of PCM a step: what the server took is counted chunk by chunk, and a
        # client that stops reading holds back one chunk, not every sentence made so far.
        self.backlog += self.reader.read()
        out = b""
        while not out and self.backlog:
            pcm, self.backlog = self.backlog[: self.block], self.backlog[self.block :]
            out = self._live(pcm)  # (an encoder may hold back a small piece)
        if not self.backlog and (self.reader.ended or row_changed or time.monotonic() >= self.next_row_check):
            out += self._check_attempt()
        return out

    def _start(self) -> bytes:
        """Before any audio: wait for the job to run (or be finished), then pick the source."""
        row = self._row()
        status = row["status"] if row else None
        if row is not None and status == SynthesisJob.Status.SUCCEEDED and row["audio_path"]:
            self.stored = open(media_path(row["audio_path"]), "rb")  # closed at EOF or by close()
            return self._stored_block()
        if status not in (SynthesisJob.Status.QUEUED, SynthesisJob.Status.RUNNING):
            raise StreamBroken(f"job {self.job_id} is {status}")
        if self.start_deadline is not None and time.monotonic() > self.start_deadline:
            raise StreamBroken(f"job {self.job_id} did not start in time")
        if status == SynthesisJob.Status.RUNNING and row is not None and self.format in STREAMABLE:
            self._open_attempt(row)  # (flac waits for the finished file)
        return b""

    def _open_attempt(self, row: dict[str, Any]) -> None:
        job = SynthesisJob(id=self.job_id, organization_id=row["organization_id"], format=row["format"])
        try:
            handle = open(stream_path(media_path(attempt_path(job, row["claim_token"]))), "rb")
        except FileNotFoundError:
            return  # not written yet, or the attempt just finished: the next step reads the row again
        self.reader, self.token = StreamReader(handle), int(row["claim_token"])
        self.next_row_check = time.monotonic() + self.row_check_seconds
        self.text_chars = int(row["text_chars"])

    def _stored_block(self) -> bytes:
        assert self.stored is not None
        block = self.stored.read(self.block)
        if not block:
            self.done = True
            self.close()
        return block

    def _live(self, pcm: bytes) -> bytes:
        """The new PCM in the response's format (the WAV header first, the encoder's output)."""
        assert self.reader is not None
        out = b""
        if self.read_pcm == 0 and pcm and self.format == "wav":
            out = wav_stream_header(self.reader.sample_rate)
        if self.format in LIVE_FORMATS and self.reader.sample_rate:
            if self.encoder is None:
                self.encoder = LiveEncoder(self.format, self.reader.sample_rate)
            out += self.encoder.feed(pcm)
        else:
            out += pcm
        self.read_pcm += len(pcm)
        self.unhanded += len(pcm)
        return out

    def handed(self) -> None:
        """The server took what the last step returned: its audio counts as delivered."""
        self.delivered += self.unhanded
        self.unhanded = 0

    def handed_so_far(self) -> ledger.Handed | None:
        """What the server took of the attempt's audio so far, and where its sentences end (the
        ledger says what that is worth: a sentence counts once all of its audio was taken)."""
        if self.reader is None:
            return None
        reader = self.reader
        return ledger.Handed(
            self.delivered, reader.sample_rate, reader.sentences, reader.total_chars, self.text_chars
        )

    def _mark(self) -> tuple[int, int]:
        """(whole sentences, PCM bytes) handed so far."""
        if self.reader is None:
            return 0, 0
        return sum(1 for end, _ in self.reader.sentences if end <= self.delivered), self.delivered

    def _record(self, final: bool = False) -> None:
        """Write what this stream delivered to the job's row once a sentence more was handed out
        (a cancel, delete or disconnect charges it), and renew the waiter's lease when due (stepped
        by a sync server: under ASGI a task keeps it, ``_keep_lease``)."""
        if self.reader is None and not self.abandon_on_close:
            return
        now = time.monotonic()
        renew = self.abandon_on_close and now >= self.next_lease_renewal
        mark = self._mark()
        if mark[0] <= self.recorded[0] and not renew and not final:
            return
        if renew:
            self.next_lease_renewal = now + settings.TTS_WAITER_LEASE_SECONDS / 3
        if mark != self.recorded or renew:
            lifecycle.report_handed(self.job_id, self.handed_so_far(), renew_waiter=renew)
            self.recorded = mark

    def _check_attempt(self) -> bytes:
        """Is the attempt being streamed still the job's? Ends the stream once its file is the job's audio."""
        assert self.reader is not None
        self.next_row_check = time.monotonic() + self.row_check_seconds
        row = self._row()
        mine = row is not None and row["claim_token"] == self.token
        if mine and row is not None and row["status"] == SynthesisJob.Status.RUNNING:
            return b""  # still going (or its completion is being committed)
        if mine and row is not None and row["status"] == SynthesisJob.Status.SUCCEEDED and self.reader.ended:
            self.done = True
            tail = self.encoder.finish() if self.encoder is not None else b""
            self.close()
            return tail
        if mine and row is not None and row["status"] == SynthesisJob.Status.SUCCEEDED:
            return b""  # the end record is on its way (read at the next step)
        raise StreamBroken(f"job {self.job_id}: the attempt with token {self.token} is no longer the job's")

    def close(self) -> None:
        for handle in (self.stored, self.reader.handle if self.reader else None):
            if handle is not None:
                handle.close()

    def give_up(self) -> None:
        """The response ended early (client gone or attempt lost): what it delivered is written to
        the job (a later cancel or delete charges it); on the OpenAI route the job ends too, charged
        for the sentences the client received."""
        self.close()
        if not self.abandon_on_close:
            if self.reader is not None:
                self._record(final=True)
            return
        # A no-op for a job settled already, or gone.
        lifecycle.report_handed(self.job_id, self.handed_so_far(), handing=lifecycle.Handing.LEFT)

    def handed_to_the_end(self) -> None:
        """The server took the stream's last chunk: on the OpenAI route, the job is settled as a completion."""
        self.close()
        if self.abandon_on_close:
            lifecycle.report_handed(self.job_id, handing=lifecycle.Handing.WHOLE)

    def _keep_lease(self) -> asyncio.Task[None] | None:
        """Under ASGI the waiter's lease is renewed by the clock, not by the steps (None: it holds
        none): a client that stops reading stops the steps, and a lease lapsed meanwhile had the
        reaper settle the job while the rest went out."""
        if not self.abandon_on_close:
            return None
        first_in = max(0.0, self.next_lease_renewal - time.monotonic())
        self.next_lease_renewal = math.inf  # the steps no longer renew it
        return keep_lease(
            lifecycle.renew_waiter, self.job_id, settings.TTS_WAITER_LEASE_SECONDS / 3, first_in
        )

    # -- the two ways a server iterates a response ------------------------------------------------
    # Each subscribes before its first step: what is published after that waits in the subscription.
    def __iter__(self) -> Iterator[bytes]:
        wakeups = SyncWakeups(self.job_id)
        to_the_end = False
        try:
            while not self.done:
                self.row_check_seconds = wakeups.row_check_seconds
                chunk = self.step(wakeups.take_row_changed())
                if chunk:
                    yield chunk
                    self.handed()  # the server asked for more: it took that chunk
                elif not self.done:
                    wakeups.wait()
            to_the_end = True
        finally:
            wakeups.close()
            if to_the_end:
                self.handed_to_the_end()
            else:
                self.give_up()
        if to_the_end and (closing := self.closing()):
            yield closing

    async def __aiter__(self) -> AsyncIterator[bytes]:
        wakeups = await AsyncWakeups(self.job_id).open()
        to_the_end = False
        keeping = self._keep_lease()
        try:
            while not self.done:
                self.row_check_seconds = wakeups.row_check_seconds
                chunk = await sync_to_async(self.step)(wakeups.take_row_changed())
                if chunk:
                    yield chunk
                    # Handed once it left the web process (deploy/asgi_worker.py); a connection
                    # closed meanwhile took nothing more (the server drops what it is sent then).
                    if self.wait_sent is not None and not await self.wait_sent():
                        break
                    self.handed()  # the server sent it and asked for more
                elif not self.done:
                    await wakeups.wait()
            else:
                to_the_end = True
        finally:
            if keeping is not None:
                keeping.cancel()
            # One shielded step: the server cancels this response once it sees the client gone,
            # which may be while the wake-ups close; what the stream handed must be settled anyway.
            ending = self.handed_to_the_end if to_the_end else self.give_up
            await asyncio.shield(_ended(wakeups, ending))
        if to_the_end and (closing := await sync_to_async(self.closing)()):
            yield closing


# Formats whose stored file an SSE stream sends in blocks: cut anywhere on a sample, each block
# plays alone (a WAV's header is in the first). A compressed file cut at 64 KB is not, so a
# finished job's mp3, Ogg, AAC or FLAC goes out as one event.
SSE_STORED_IN_BLOCKS = ("pcm", "wav", *G711_FORMATS)


TIMESTAMPS_EVENT = "speech.timestamps"  # ours, not OpenAI's: its clients skip types they do not know


def sse_event(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


class SSEJobStream(JobStream):
    """A ``JobStream`` framed as OpenAI's speech events (``stream_format: "sse"``).

    ``timestamps``: after each sentence's audio, a ``speech.timestamps`` event with that
    sentence's span and words (``{"type", "sentence", "words"}``, the shapes of
    ``GET /api/v1/speech/{id}/timestamps``), from the stream file's ``T`` records; a stored
    file's come from the job's row before ``speech.audio.done``.

    Each step's audio is one ``speech.audio.delta`` event (base64), so ``handed()`` and the
    server's ``wait_sent`` count events as they count chunks: a client that leaves pays for the
    sentences whose events left the process. Live, a delta is what the chunked stream would send
    in that step (PCM samples, the WAV's streaming header in the first, the live encoder's whole
    mp3/AAC frames and Ogg pages). The stream's normal end settles the job (``handed_to_the_end``)
    before ``speech.audio.done`` is built, so its usage is the charge itself: ``input_tokens`` and
    ``total_tokens`` are the billable characters charged, ``output_tokens`` 0.
    """

    def __init__(self, *args: Any, timestamps: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timestamps = timestamps
        self.timestamps_sent = 0  # sentences whose timestamps event went out

    @property
    def media_type(self) -> str:
        return "text/event-stream"

    def step(self, row_changed: bool = False) -> bytes:
        audio = super().step(row_changed)
        out = b""
        if audio:
            out = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode("ascii")})
        if self.timestamps and self.reader is not None:
            # A sentence's event once its audio was given to a step (some may wait in the backlog).
            for at, event in self.reader.timestamps[self.timestamps_sent :]:
                if at > self.read_pcm:
                    break
                out += sse_event({"type": TIMESTAMPS_EVENT, **event})
                self.timestamps_sent += 1
        return out

    def _stored_block(self) -> bytes:
        if self.format in SSE_STORED_IN_BLOCKS:
            return super()._stored_block()
        assert self.stored is not None
        whole = self.stored.read()  # compressed: at most a few MB for OpenAI's 4096 characters
        self.done = True
        self.close()
        return whole

    def closing(self) -> bytes:
        usage = reports.speech_usage(reports.job_charge(self.job_id))
        return self._stored_timestamps() + sse_event({"type": "speech.audio.done", "usage": usage})

    def _stored_timestamps(self) -> bytes:
        """The events not sent live (a stored file was sent): from the timestamps published with it."""
        if not self.timestamps:
            return b""
        row = JobTimestamps.objects.filter(job_id=self.job_id).values("words", "sentences").first()
        if row is None:
            return b""
        out = b""
        for sentence in row["sentences"][self.timestamps_sent :]:
            start, end = sentence["start"], sentence["end"]
            words = [w for w in row["words"] if start <= w["start"] and w["end"] <= end + 1e-3]
            out += sse_event({"type": TIMESTAMPS_EVENT, "sentence": sentence, "words": words})
            self.timestamps_sent += 1
        return out


class JobStreamResponse(StreamingHttpResponse):
    """Chunked audio (or its server-sent events) of one job: a generator under WSGI, an async one under ASGI."""

    def __init__(self, stream: JobStream) -> None:
        super().__init__(iter(stream), content_type=stream.media_type)
        self.job_stream = stream
        self["Cache-Control"] = "no-store"
        self["X-Accel-Buffering"] = "no"  # Nginx passes each chunk on at once
        self["X-Job-Id"] = str(stream.job_id)

    async def __aiter__(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        async for part in self.job_stream.__aiter__():
            yield part


def wants_stream(request: Any, data: dict[str, Any]) -> bool:
    """Chunked streaming on /v1/audio/speech: ``stream_format: "audio"`` in the body, or the official
    client's ``with_streaming_response`` (it sends ``X-Stainless-Raw-Response: stream``); ``"sse"``
    is asked for in the body only (the view checks it first)."""
    if data.get("stream_format") == "audio":
        return True
    return str(request.headers.get("X-Stainless-Raw-Response", "")).lower() == "stream"


class SpeechStreamView(TenantAPIView):
    """``GET /api/v1/speech/{id}/stream``: a running job's audio as it is made, or a finished job's file."""

    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
        summary="Stream the job's audio while it is synthesised (chunked)",
    )
    def get(self, request: Request, job_id: str) -> HttpResponseBase:
        job = self.get_job(job_id)
        if job.status == SynthesisJob.Status.EXPIRED:
            raise DomainError(
                ErrorCode.AUDIO_EXPIRED, "This job's audio passed its retention period and was deleted."
            )
        if job.status in (SynthesisJob.Status.FAILED, SynthesisJob.Status.CANCELED):
            raise DomainError(ErrorCode.AUDIO_NOT_READY, f"The job is {job.status}; it has no audio.")
        if job.is_finished:  # its stored file, sent at once: no wait
            return JobStreamResponse(JobStream(job.pk, job.format, wait_sent=server_wait_sent(request)))
        # A stream of a job still being made waits on it like a long-poll: one of the tenant's
        # wait slots (429 too_many_waits), held until the response closes. It lasts as long as
        # the job may run; a stream still open after that ages out of the count.
        slot = WaitSlot.take(self.organization, _stream_slot_seconds(job))
        stream = JobStream(job.pk, job.format, wait_sent=server_wait_sent(request))
        return slot.given_back_on_close(JobStreamResponse(stream))


def _stream_slot_seconds(job: SynthesisJob) -> float:
    if job.time_limit is not None:
        return max(job.time_limit.total_seconds(), float(settings.TTS_LONG_POLL_MAX_SECONDS))
    return float(settings.TTS_LONG_POLL_MAX_SECONDS)
