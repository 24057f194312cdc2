"""``POST /v1/audio/speech``: OpenAI's speech endpoint on top of ordinary jobs.

It runs a normal job (quota, history, limits and rate apply), waits for it up
to ``TTS_OPENAI_WAIT_SECONDS`` and answers with the audio bytes. On that
timeout the job is canceled, its characters given back, and the answer is a
504. Errors use OpenAI's shape ``{"error": {"message","type","param","code"}}``
so OpenAI's clients show them; unknown body fields are ignored because
OpenAI's newer clients send more over time.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.http import FileResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions as drf_exceptions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.problems import Problem, problem_from_drf
from webapp.speech import services
from webapp.speech.api.serializers import OpenAISpeechSerializer
from webapp.speech.api.views import TenantAPIView, submit
from webapp.speech.models import SynthesisJob

# OpenAI response_format -> (our format, sample rate). OpenAI defines opus as
# Ogg/Opus and pcm as headerless 24 kHz 16-bit little-endian.
FORMATS: dict[str, tuple[str, int | None]] = {
    "mp3": ("mp3", None),
    "opus": ("ogg", 24000),
    "aac": ("aac", None),
    "flac": ("flac", None),
    "wav": ("wav", None),
    "pcm": ("pcm", 24000),
}
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
POLL_SECONDS = 0.1


def openai_error_type(problem: Problem) -> str:
    if problem.status == 401:
        return "authentication_error"
    if problem.status == 403:
        return "permission_error"
    if problem.code == "quota_exceeded":
        return "insufficient_quota"
    if problem.status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if problem.status < 500 else "server_error"


def openai_response(problem: Problem) -> Response:
    code = "invalid_api_key" if problem.status == 401 else problem.code
    body = {
        "error": {
            "message": problem.detail,
            "type": openai_error_type(problem),
            "param": problem.field,
            "code": code,
        }
    }
    response = Response(body, status=problem.status, headers=problem.headers())
    if problem.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def resolve_voice(value: Any) -> str:
    """OpenAI names through TTS_OPENAI_VOICE_MAP; our own voice ids pass through."""
    if isinstance(value, dict):  # newer clients may send {"id": "..."}
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise Problem(400, "invalid_voice", "voice must be a voice name such as 'alloy'.", field="voice")
    return str(settings.TTS_OPENAI_VOICE_MAP.get(value.lower(), value))


class IgnoreAccept(BaseContentNegotiation):
    """OpenAI's client asks for application/octet-stream; errors are JSON regardless."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0]

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class OpenAISpeechView(TenantAPIView):
    required_scopes = {"POST": "speech:write"}
    content_negotiation_class = IgnoreAccept

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, Problem):
            problem = exc
        elif isinstance(exc, drf_exceptions.APIException):
            problem = problem_from_drf(exc)
        else:
            raise exc
        return openai_response(problem)

    @extend_schema(
        request=OpenAISpeechSerializer,
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
        summary="OpenAI-compatible synchronous speech",
    )
    def post(self, request: Request) -> HttpResponseBase:
        body = request.data
        if not isinstance(body, dict):
            raise Problem(400, "invalid_request", "The body must be a JSON object.")
        serializer = OpenAISpeechSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        response_format = data.get("response_format") or "mp3"
        fmt, rate = FORMATS[response_format]
        ours: dict[str, Any] = {"text": data["input"], "voice": resolve_voice(data["voice"]), "format": fmt}
        if rate is not None:
            ours["sample_rate"] = rate
        if data.get("speed") is not None:
            ours["speed"] = data["speed"]
        if data.get("instructions"):
            ours["instructions"] = data["instructions"]
        try:
            job, _ = submit(request, self.organization, ours, "openai")
        except Problem as problem:
            if problem.field == "text":
                problem.field = "input"
            raise
        job = self._wait(job)
        if job.status == SynthesisJob.Status.SUCCEEDED and job.audio_path:
            handle = open(services.audio_abspath(job.audio_path), "rb")  # FileResponse closes it
            return FileResponse(handle, content_type=CONTENT_TYPES[response_format])
        if not job.is_finished:
            services.abandon_job(job)
            raise Problem(
                504,
                "timeout",
                f"Synthesis did not finish within {settings.TTS_OPENAI_WAIT_SECONDS} s; the job was canceled "
                "and nothing was charged. Use POST /api/v1/speech for long texts.",
            )
        raise Problem(
            500 if job.status == SynthesisJob.Status.FAILED else 409,
            job.error_code or f"job_{job.status}",
            job.error_message or f"The job ended {job.status}.",
        )

    def _wait(self, job: SynthesisJob) -> SynthesisJob:
        deadline = time.monotonic() + settings.TTS_OPENAI_WAIT_SECONDS
        while time.monotonic() < deadline:
            status = SynthesisJob.objects.filter(pk=job.pk).values_list("status", flat=True).first()
            if status is None or status in SynthesisJob.FINISHED:
                break
            time.sleep(POLL_SECONDS)
        return SynthesisJob.objects.get(pk=job.pk)
