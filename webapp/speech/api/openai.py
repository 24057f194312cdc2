"""``POST /v1/audio/speech``: OpenAI's speech endpoint on top of ordinary jobs.

It runs a normal job (quota, history, limits and rate apply), waits for it up
to ``TTS_OPENAI_WAIT_SECONDS`` and answers with the audio bytes. The job is
settled by that answer: charged once its first block (a stream's last) was
handed to the connection, and for what its stream handed if the client left
first (``lifecycle.report_handed``, whole or left). On that
timeout the job is canceled, its characters given back, and the answer is a
504 (``x-should-retry: false``). The request holds the job's waiter lease while
it waits: a client that disconnects abandons the job at once, and one whose web
process died is abandoned by the reaper once the lease lapses. ``Idempotency-Key``
is honoured as on ``POST /api/v1/speech``: a retry gets the same job.

``stream_format: "audio"`` streams the audio chunked as sentences finish, ``"sse"`` as OpenAI's
server-sent events (``SSEJobStream``: the same stream, each chunk one event); either way the
stream settles the job as a chunked one does. flac cannot be cut while it is made: it waits
for the whole file like an ordinary answer (504 on the timeout), and as SSE is then one event.

Errors use OpenAI's shape ``{"error": {"message","type","param","code"}}``
(rendered by ``webapp.problems``, which picks the shape by path) so OpenAI's
clients show them; unknown body fields are ignored because OpenAI's newer
clients send more over time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request

from synth.audio import content_type
from webapp.errors import DomainError, ErrorCode
from webapp.problems import render
from webapp.speech import lifecycle
from webapp.speech.api.serializers import OPENAI_FORMATS, OpenAISpeechSerializer
from webapp.speech.api.streaming import (
    STREAMABLE,
    JobStream,
    JobStreamResponse,
    SSEJobStream,
    server_wait_sent,
    wants_stream,
)
from webapp.speech.api.views import TenantAPIView, replayed, request_key, submit
from webapp.speech.api.voices import reference_voice
from webapp.speech.api.waiting import WaitingAPIView
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.services.files import media_path
from webapp.speech.services.ledger import reports
from webapp.speech.services.queries import voice_id_named
from webapp.speech.services.waiting import Wait, WaiterLease, WaitSlot, keep_lease, wait_view
from webapp.speech.voices import forget_one_off
from webapp.tenants.models import Organization


@dataclass(frozen=True)
class AnswerForm:
    """The answer a waiting request waits for: the file, or (``sse``) server-sent events, then with
    ``timestamps`` events too (a flac answer waits for its whole file either way)."""

    sse: bool = False
    timestamps: bool = False


SSE_SCHEMA = (
    'The audio bytes (chunked as sentences finish with stream_format "audio"). With stream_format '
    '"sse", text/event-stream: `data: {"type": "speech.audio.delta", "audio": "<base64>"}` events, '
    'then `data: {"type": "speech.audio.done", "usage": {"input_tokens": N, "output_tokens": 0, '
    '"total_tokens": N}}`, N the billable characters the job was charged. With "timestamps": true, '
    'each sentence\'s audio is followed by `data: {"type": "speech.timestamps", "sentence": {...}, '
    '"words": [...]}` (the shapes of GET /api/v1/speech/{id}/timestamps).'
)

FORMATS = OPENAI_FORMATS  # response_format -> (our format, its default rate)


# The speech models OpenAI's clients name: aliases of the default, the voice's own model.
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def resolve_voice(value: Any, mapped: bool = True) -> str:
    """OpenAI names through TTS_OPENAI_VOICE_MAP (unless not ``mapped``: a model's own voice, which
    the submission tries before the map); our own voice ids pass through."""
    if isinstance(value, dict):  # newer clients may send {"id": "..."}
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise DomainError(
            ErrorCode.INVALID_VOICE, "voice must be a voice name such as 'alloy'.", field="voice"
        )
    return str(settings.TTS_OPENAI_VOICE_MAP.get(value.lower(), value)) if mapped else value


class IgnoreAccept(BaseContentNegotiation):
    """OpenAI's client asks for application/octet-stream; errors are JSON regardless."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0]

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


def job_body(data: dict[str, Any], organization: Organization | None = None) -> dict[str, Any]:
    """Our /api/v1/speech body for a validated OpenAI body.

    ``model``: OpenAI's own names leave the voice's model speaking; any other is the ``engine``,
    and the voice goes as sent (the submission tries it as that model's voice, then the map).
    ``organization``: a voice may be the name of one of its uploaded voices (vLLM-Omni's way).
    """
    fmt, rate = FORMATS[data.get("response_format") or "mp3"]
    model = str(data.get("model") or OPENAI_MODELS[0])  # vLLM-Omni's clients may name none
    if model in OPENAI_MODELS:
        voice = resolve_voice(data["voice"])
        ours: dict[str, Any] = {"text": data["input"], "format": fmt}
    else:
        voice = resolve_voice(data["voice"], mapped=False)
        ours = {"text": data["input"], "engine": model, "format": fmt}
    ours["voice"] = voice_id_named(organization, voice) if organization is not None else voice
    if data.get("sample_rate") is not None:
        rate = data["sample_rate"]  # checked against the voice's rates for the format at submit
    if rate is not None:
        ours["sample_rate"] = rate
    if data.get("language"):
        ours["language"] = data["language"]
    for name in ("speed", "loudness", "seed"):
        if data.get(name) is not None:
            ours[name] = data[name]
    if data.get("instructions"):  # (None: vLLM-Omni's null)
        ours["instructions"] = data["instructions"]
    if data.get("cache") is False:
        ours["cache"] = False
    if data.get("voice_fallback") not in (None, "none"):
        ours["voice_fallback"] = data["voice_fallback"]  # an extension field, as cache and seed
    return ours


class OpenAISpeechView(WaitingAPIView, TenantAPIView):
    required_scopes = {"POST": "speech:write"}
    content_negotiation_class = IgnoreAccept

    @extend_schema(
        request=OpenAISpeechSerializer,
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description=SSE_SCHEMA),
            (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description=SSE_SCHEMA),
        },
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER)],
        summary="OpenAI-compatible synchronous speech",
    )
    def post(self, request: Request) -> HttpResponseBase | Wait:
        body = request.data
        if not isinstance(body, dict):
            raise DomainError(ErrorCode.INVALID_REQUEST, "The body must be a JSON object.")
        serializer = OpenAISpeechSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        wait = settings.TTS_OPENAI_WAIT_SECONDS  # for the job; a stream's for its first audio
        # Before the submit: a request refused for want of a wait slot leaves no job behind.
        slot = WaitSlot.take(self.organization, wait)
        try:
            sse = serializer.validated_data.get("stream_format") == "sse"
            asked_stream = sse or wants_stream(request, serializer.validated_data)
            job, created = submit_speech(request, self.organization, serializer.validated_data, asked_stream)
            timestamps = bool(serializer.validated_data.get("timestamps"))
            streams = asked_stream and job.format in STREAMABLE
            if streams and model_streams(job):
                stream = (SSEJobStream if sse else JobStream)(
                    job.pk,
                    job.format,
                    abandon_on_close=True,
                    start_within=wait,
                    wait_sent=server_wait_sent(request),
                    fresh_lease=created,
                    **({"timestamps": True} if timestamps else {}),
                )
                return slot.given_back_on_close(JobStreamResponse(stream))
        except BaseException:
            slot.give_back()  # refused, or broken: nothing waits
            raise
        # openai_speech waits for the job to finish, then answer_after_wait delivers it; the request
        # holds the job's waiter lease meanwhile, and its client going away abandons the job.
        lease = WaiterLease(
            renew=lifecycle.renew_waiter,
            leave=leave,
            every=settings.TTS_WAITER_LEASE_SECONDS / 3,
            fresh=created,
        )
        # (flac, sent whole, waits here too; as SSE its file is then one event.)
        return Wait(
            job.pk,
            wait,
            lambda now: now[0] in SynthesisJob.FINISHED,
            slot=slot,
            lease=lease,
            answer=AnswerForm(sse=sse, timestamps=timestamps),
        )


def model_streams(job: SynthesisJob) -> bool:
    """Whether the job's model sends audio as sentences finish (its ``streaming`` capability): one
    that does not is answered whole once done, as a flac is (SSE: the file as one event)."""
    caps = Voice.objects.filter(voice_id=job.voice_name).values_list("capabilities", flat=True).first()
    return (caps or {}).get("streaming", True) is not False


def leave(job_id: Any) -> None:
    """The waiting client disconnected before its answer was sent: the job ends, nothing charged."""
    # Also a job that succeeded as it left: its answer was never sent.
    lifecycle.report_handed(job_id, handing=lifecycle.Handing.LEFT)


def submit_speech(
    request: Request, organization: Organization, data: dict[str, Any], streams: bool, item: int | None = None
) -> tuple[SynthesisJob, bool]:
    """The job, and whether this request made it (not an Idempotency-Key replay). ``streams``: the
    client asked for a stream, which a full interactive lane refuses at once (a whole file waits).
    ``item``: the body is that item of a batch (POST /v1/audio/speech/batch). ``ref_audio``: the
    job clones it, as a one-off voice deleted once the job ends (``voices.one_off_job_ended``)."""
    if not data.get("ref_audio"):
        return _submitted(request, organization, data, streams, item)
    # The reference audio becomes a voice of its own each time: a retry's Idempotency-Key is matched
    # on the audio it names, and finds its job before a second voice is made of it.
    digest = hashlib.sha256(
        "\0".join(str(data.get(k) or "") for k in ("ref_audio", "ref_text", "consent")).encode()
    ).hexdigest()
    key_body = job_body({**data, "voice": f"ref_audio:{digest}"})
    replay = replayed(organization, request_key(request, "openai", item), key_body)
    if replay is not None:
        return replay, False
    reference = reference_voice(request, organization, data)
    data = {**data, "voice": reference.voice_id}
    try:
        job, created = _submitted(request, organization, data, streams, item, key_body)
    except BaseException:
        forget_one_off(organization, reference)  # no job will use it
        raise
    if not created:
        forget_one_off(organization, reference)  # a concurrent retry's job has its own
    return job, created


def _submitted(
    request: Request,
    organization: Organization,
    data: dict[str, Any],
    streams: bool,
    item: int | None,
    key_body: dict[str, Any] | None = None,
) -> tuple[SynthesisJob, bool]:
    try:
        return submit(
            request,
            organization,
            job_body(data, organization),
            "openai",
            bool(data.get("timestamps")),
            admit=streams,
            item=item,
            key_body=key_body,
        )
    except DomainError as error:
        if error.field == "text":
            error.field = "input"  # OpenAI's name for it
        elif error.field == "engine":
            error.field = "model"
        elif error.code == ErrorCode.UNSUPPORTED_SAMPLE_RATE and "allowed_sample_rates" in error.extra:
            # The submission names our format (ogg); the client named OpenAI's (opus).
            rates = ", ".join(str(r) for r in error.extra["allowed_sample_rates"])
            response_format = data.get("response_format") or "mp3"
            error.message = (
                f"sample_rate {data.get('sample_rate')} is not available for response_format "
                f"{response_format}; use one of {rates}."
            )
        raise


READ_BLOCK = 1024 * 1024  # bytes of the file in memory at once while an answer is sent


def _open_binary(path: str) -> BinaryIO:
    return open(path, "rb")  # closed by the response


class AnswerResponse(StreamingHttpResponse):
    """A finished job's stored audio as the waiting client's answer, read ``READ_BLOCK`` at a time
    as the server sends it, which settles the job once it took the first block
    (``lifecycle.report_handed`` whole: a no-op for a job settled already, such as a replay's).

    Under ASGI each block is read in a pool thread (Django would read a sync iterator whole
    before sending any of it: a ten-minute WAV is 26 MB); under WSGI and in Django's test client
    the sync iterator is read. Under ASGI the answer also keeps the wait's ``lease`` until that
    first block was taken: a client that stops reading holds the send for as long as it likes,
    and a lease lapsed meanwhile had the reaper release the job while the file went out whole.
    """

    def __init__(self, path: str, media_type: str, job_id: Any, lease: WaiterLease | None = None) -> None:
        self.path, self.job_id, self.lease = path, job_id, lease
        super().__init__(self._blocks(), content_type=media_type)
        self["Content-Length"] = str(os.path.getsize(path))

    def _blocks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as handle:
            taken = 0
            while block := handle.read(READ_BLOCK):
                yield block
                taken += 1
                if taken == 1:
                    _answer_handed(self.job_id)

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:  # type: ignore[override]
        handle = await sync_to_async(_open_binary, thread_sensitive=False)(self.path)
        read = sync_to_async(handle.read, thread_sensitive=False)
        # The wait renewed the lease at most one period ago: the next renewal is a period away.
        lease = self.lease
        keeping = keep_lease(lease.renew, self.job_id, lease.every, lease.every) if lease else None
        handed = sync_to_async(_answer_handed, thread_sensitive=False)
        given = settled = False
        try:
            while block := await read(READ_BLOCK):
                given = True
                yield block
                if not settled:
                    settled = True
                    await handed(self.job_id)
                    if keeping is not None:
                        keeping.cancel()  # settled: the job holds no waiter now
        finally:
            if keeping is not None:
                keeping.cancel()
            handle.close()
            if given and not settled:
                # Closed at its first block, which the server's send had taken: Django cancels an
                # answer once its connection closes, and Nginx closes it as soon as the whole body
                # came (a file of one block), sometimes before this generator was resumed.
                await asyncio.shield(handed(self.job_id))


def _answer_handed(job_id: Any) -> None:
    lifecycle.report_handed(job_id, handing=lifecycle.Handing.WHOLE)


def deliver(
    job_id: Any,
    sse_for: HttpRequest | None = None,
    timestamps: bool = False,
    lease: WaiterLease | None = None,
) -> HttpResponseBase:
    """The audio of a finished job, or the error that says why there is none (cancels a job still going).

    ``sse_for``: the request asked for server-sent events; the stored file is then sent by an
    ``SSEJobStream`` (one event for a compressed file), settled once it was all handed; with
    ``timestamps``, its timestamps events follow the audio. ``lease``: the wait's waiter lease,
    which the file's answer keeps until it settled the job (a stream keeps its own).
    """
    # Only what the audio needs: every request answers here; the whole row only when there is none.
    status, audio_path, audio_format = SynthesisJob.objects.values_list("status", "audio_path", "format").get(
        pk=job_id
    )
    if status == SynthesisJob.Status.SUCCEEDED and audio_path and sse_for is not None:
        stream = SSEJobStream(
            job_id,
            audio_format,
            abandon_on_close=True,
            wait_sent=server_wait_sent(sse_for),
            timestamps=timestamps,
        )
        return JobStreamResponse(stream)
    if status == SynthesisJob.Status.SUCCEEDED and audio_path:
        response = AnswerResponse(media_path(audio_path), content_type(audio_format), job_id, lease)
        for name, value in reports.speech_usage_headers(reports.job_reserved(job_id)).items():
            response[name] = value  # vLLM-Omni's usage, before the body: what the whole answer is charged
        return response
    raise not_delivered(SynthesisJob.objects.get(pk=job_id))


def not_delivered(job: SynthesisJob) -> DomainError:
    if not job.is_finished:
        lifecycle.report_handed(job.id, handing=lifecycle.Handing.LEFT)
        return DomainError(
            ErrorCode.TIMEOUT,
            f"Synthesis did not finish within {settings.TTS_OPENAI_WAIT_SECONDS} s; the job was canceled "
            "and nothing was charged. Use POST /api/v1/speech for long texts.",
        )
    if job.status == SynthesisJob.Status.FAILED:
        return DomainError(
            ErrorCode.JOB_FAILED, job.error_message or "The job failed.", extra={"job_error": job.error_code}
        )
    return DomainError(
        ErrorCode.JOB_CANCELED,
        f"The job ended {job.status} (a client waiting for it went away, or it was canceled); "
        "send the request again with a new Idempotency-Key.",
    )


def answer_after_wait(request: HttpRequest, wait: Wait) -> HttpResponseBase:
    """The OpenAI endpoint's answer once its wait is over: the audio, or the error in OpenAI's shape."""
    try:
        answer = wait.answer if isinstance(wait.answer, AnswerForm) else AnswerForm()
        response = deliver(
            wait.job_id, request if answer.sse else None, timestamps=answer.timestamps, lease=wait.lease
        )
    except DomainError as error:
        response = render(request, error)
        if error.code == ErrorCode.TIMEOUT:
            # The job was canceled: OpenAI's clients retry a 504 unless told not to, and each
            # retry would wait as long again for a job as long.
            response["x-should-retry"] = "false"
    for key, value in wait.headers.items():
        response[key] = value
    return response


# POST: DRF's dispatch in a thread (a finished answer when refused or streamed), then the wait here.
openai_speech = wait_view(OpenAISpeechView.as_view(), answer_after_wait)
