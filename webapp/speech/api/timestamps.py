"""GET /api/v1/speech/{id}/timestamps: a job's word and sentence timestamps, as JSON or captions.

Times are seconds from the audio's first sample; ``char_start``/``char_end`` are offsets into the
text as submitted (a number read out, an abbreviation or an annotation maps every word it became
back to the characters the client wrote; ``spoken`` says what was read where it differs). The
worker publishes them with the audio (synth.timestamps, lifecycle.complete_job) and they go when
the audio expires. ``?format=srt`` / ``?format=vtt`` are captions, one cue per sentence or, with
``?level=word``, per word.
"""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.speech.api.views import TenantAPIView
from webapp.speech.models import JobTimestamps, SynthesisJob
from webapp.speech.services.captions import srt_captions, vtt_captions
from webapp.speech.services.jobview import JobView

CAPTION_FORMATS = ("json", "srt", "vtt")
LEVELS = ("sentence", "word")
_CONTENT_TYPES = {"srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}


class WordTimestampSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="The characters of the submitted text this word speaks.")
    start = serializers.FloatField(help_text="Seconds from the start of the audio.")
    end = serializers.FloatField(help_text="Seconds from the start of the audio.")
    char_start = serializers.IntegerField(help_text="Offset of the first character in the submitted text.")
    char_end = serializers.IntegerField(help_text="Offset just past the last character (a Python slice).")
    spoken = serializers.CharField(
        required=False,
        help_text="What was read, where it differs from ``text``: ``forty`` and ``two`` for ``42``.",
    )


class SentenceTimestampSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    text = serializers.CharField(help_text="The sentence as submitted.")
    start = serializers.FloatField()
    end = serializers.FloatField(
        help_text="The end of its audio; the pause before the next sentence is outside."
    )
    char_start = serializers.IntegerField()
    char_end = serializers.IntegerField()


class TimestampsSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    duration_seconds = serializers.FloatField(allow_null=True)
    words = WordTimestampSerializer(
        many=True,
        help_text="In order, never overlapping; empty where the engine cannot tell (a batching torch worker).",
    )
    sentences = SentenceTimestampSerializer(many=True)


class SpeechTimestampsView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # ?format= names the caption format here; DRF would take it for a renderer's and answer 404.
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    @extend_schema(
        summary="The job's word and sentence timestamps, or captions",
        parameters=[
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=list(CAPTION_FORMATS),
                default="json",
                description="`json` (timestamps), `srt` or `vtt` (captions). Anything else is 400.",
            ),
            OpenApiParameter(
                "level",
                OpenApiTypes.STR,
                enum=list(LEVELS),
                default="sentence",
                description="Captions only: one cue per sentence (default) or per word.",
            ),
        ],
        responses={
            (200, "application/json"): TimestampsSerializer,
            (200, "application/x-subrip"): OpenApiResponse(OpenApiTypes.STR, description="SubRip captions"),
            (200, "text/vtt"): OpenApiResponse(OpenApiTypes.STR, description="WebVTT captions"),
            400: OpenApiResponse(
                description="`unsupported_format` (not json/srt/vtt) or `invalid_request` (level)"
            ),
            404: OpenApiResponse(
                description="`not_found`: no such job in this organization, or none recorded"
            ),
            409: OpenApiResponse(
                description="`audio_not_ready`: the job has not succeeded (queued, running...)"
            ),
            410: OpenApiResponse(
                description="`audio_expired`: the audio and its timestamps passed retention"
            ),
        },
    )
    def get(self, request: Request, job_id: str) -> HttpResponse:
        fmt = request.query_params.get("format", "json")
        if fmt not in CAPTION_FORMATS:
            raise DomainError(
                ErrorCode.UNSUPPORTED_FORMAT,
                f"format {fmt!r} is not a timestamps format; use one of {', '.join(CAPTION_FORMATS)}",
                field="format",
            )
        level = request.query_params.get("level", "sentence")
        if level not in LEVELS:
            raise DomainError(
                ErrorCode.INVALID_REQUEST, f"level must be one of {', '.join(LEVELS)}", field="level"
            )
        job = self.get_job(job_id)
        if job.status == SynthesisJob.Status.EXPIRED:
            raise DomainError(
                ErrorCode.AUDIO_EXPIRED, "This job's audio and its timestamps passed their retention period."
            )
        if job.status != SynthesisJob.Status.SUCCEEDED:
            raise DomainError(
                ErrorCode.AUDIO_NOT_READY, f"The job is {job.status}; timestamps exist once it has succeeded."
            )
        row = JobTimestamps.objects.filter(job_id=job.id).first()
        if row is None:
            raise DomainError(ErrorCode.NOT_FOUND, f"Job {job.id} has no timestamps recorded.")
        data = JobView(job).for_timestamps(row.words, row.sentences)
        if fmt == "json":
            return Response(data, headers={"Cache-Control": "private, no-store"})
        body = srt_captions(data, level) if fmt == "srt" else vtt_captions(data, level)
        response = HttpResponse(body, content_type=_CONTENT_TYPES[fmt])
        response["Content-Disposition"] = f'inline; filename="{job.id}.{fmt}"'
        response["Cache-Control"] = "private, no-store"
        return response
