"""REST API v1: views parse and authorise; the services change state.

Every object is looked up inside the caller's tenant, so another tenant's
job or voice is a 404 on every endpoint, never a 403 and never the object.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView
from rest_framework.request import Request
from rest_framework.response import Response

from synth.audio import content_type
from webapp.errors import DomainError, ErrorCode
from webapp.problems import render
from webapp.speech import lifecycle, submission
from webapp.speech.api.pagination import JobCursorPagination
from webapp.speech.api.params import int_param
from webapp.speech.api.serializers import (
    JobPageSerializer,
    JobSerializer,
    UsageSerializer,
    VoiceSerializer,
)
from webapp.speech.api.voice_fields import may_see_embeddings
from webapp.speech.api.waiting import WaitingAPIView
from webapp.speech.models import SynthesisJob, Voice
from webapp.speech.requests import SpeechRequestSerializer
from webapp.speech.services import queries
from webapp.speech.services.ledger import reports
from webapp.speech.services.queries import visible_voices
from webapp.speech.services.waiting import SharedAnswer, Wait, WaitSlot, wait_view
from webapp.speech.voices import delete_voice
from webapp.tenants.api.base import TenantAPIView as KeyedAPIView
from webapp.tenants.api.base import not_found, object_id
from webapp.tenants.models import ApiKey, Organization
from webapp.tenants.permissions import require_job_access

MAX_IDEMPOTENCY_KEY = 255


class TenantAPIView(KeyedAPIView):
    """A tenant API view of the speech app: the tenant's jobs, looked up inside the tenant."""

    def get_job(self, job_id: str) -> SynthesisJob:
        """The tenant's job with this id (invalid_id, not_found as ``tenant_object``)."""
        pk = object_id(job_id, "job")
        job = queries.job_row(pk, self.organization.pk)
        if job is None:
            raise not_found("job", pk)
        return job

    def get_owned_job(self, job_id: str) -> SynthesisJob:
        """A job this key may change: any of the tenant's for owners and admins, else its own user's."""
        job = self.get_job(job_id)
        require_job_access(self.request.user, job.user_id)
        return job

    def job_response(self, job: SynthesisJob, status: int = 200, **headers: str) -> Response:
        data = JobSerializer(job, context={"request": self.request}).data
        return Response(data, status=status, headers=headers or None)


# --------------------------------------------------------------------- voices


class VoiceListView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses=VoiceSerializer(many=True), summary="Voices this tenant may use")
    def get(self, request: Request) -> Response:
        voices = visible_voices(self.organization).order_by("organization_id", "engine", "voice_id")
        context = {"with_embedding": may_see_embeddings(request)}
        return Response({"results": VoiceSerializer(voices, many=True, context=context).data})


class VoiceDetailView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "DELETE": "voices:write"}

    def get_voice(self, voice_id: str) -> Voice:
        voice = (
            Voice.objects.filter(voice_id=voice_id)
            .filter(
                Q(organization__isnull=True, status=Voice.Status.READY)
                | Q(
                    organization=self.organization,
                    status__in=[Voice.Status.READY, Voice.Status.PROCESSING, Voice.Status.REJECTED],
                )
            )
            .first()
        )
        if voice is None:
            raise DomainError(ErrorCode.NOT_FOUND, f"No voice {voice_id[:200]!r} for this organization.")
        return voice

    @extend_schema(responses=VoiceSerializer, summary="One voice")
    def get(self, request: Request, voice_id: str) -> Response:
        context = {"with_embedding": may_see_embeddings(request)}
        return Response(VoiceSerializer(self.get_voice(voice_id), context=context).data)

    @extend_schema(responses={204: None}, summary="Delete one of this tenant's own voices")
    def delete(self, request: Request, voice_id: str) -> Response:
        delete_voice(self.organization, self.get_voice(voice_id))
        return Response(status=204)


# --------------------------------------------------------------------- speech


def _idempotency_key(request: Request) -> str | None:
    raw = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if raw is None:
        return None
    if not raw or len(raw) > MAX_IDEMPOTENCY_KEY:
        raise DomainError(
            ErrorCode.INVALID_IDEMPOTENCY_KEY,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters; got {len(raw)}.",
            field="Idempotency-Key",
        )
    if not raw.isprintable() or not raw.isascii():
        raise DomainError(
            ErrorCode.INVALID_IDEMPOTENCY_KEY,
            "Idempotency-Key must be printable ASCII.",
            field="Idempotency-Key",
        )
    return raw


def _item_key(key: str | None, item: int | None) -> str | None:
    """A batch item's own key, derived from the batch's (hashed: the column holds what one key may)."""
    if key is None or item is None:
        return key
    return f"batch:{hashlib.sha256(key.encode()).hexdigest()[:40]}:{item}"


def request_key(request: Request, source: str, item: int | None = None) -> str | None:
    """The Idempotency-Key a submit of ``source`` honours (an item's own in a batch); None without one."""
    return _item_key(_idempotency_key(request), item) if source in ("api", "openai") else None


def replayed(organization: Organization, key: str | None, key_body: dict[str, Any]) -> SynthesisJob | None:
    """The job an earlier request under this key and body made (None: none, or no key)."""
    if key is None:
        return None
    return lifecycle.idempotent_replay(organization, key, lifecycle.request_fingerprint(key_body))


def submit(
    request: Request,
    organization: Organization,
    data: Any,
    source: str,
    word_timestamps: bool = False,
    admit: bool = False,
    item: int | None = None,
    key_body: dict[str, Any] | None = None,
) -> tuple[SynthesisJob, bool]:
    """Shared by /api/v1/speech and /v1/audio/speech: parse the body, then the one submit service.

    ``item``: the body is that item of a batch, whose Idempotency-Key names each item apart.
    ``key_body``: what the Idempotency-Key's fingerprint is taken of, when not ``data`` (a request's
    reference audio makes a voice of its own each time: its retry names the same audio instead)."""
    if not isinstance(data, dict):
        raise DomainError(
            ErrorCode.INVALID_REQUEST, 'The body must be a JSON object, e.g. {"text": "Hello"}.'
        )
    context = {"organization": organization, "source": source, "word_timestamps": word_timestamps}
    serializer = SpeechRequestSerializer(data=data, context=context)
    serializer.is_valid(raise_exception=True)
    auth = request.auth if isinstance(request.auth, ApiKey) else None
    submitted = submission.submit(
        organization,
        serializer.validated_data["job"],
        body=data if key_body is None else key_body,
        api_key=auth,
        user=auth.user if auth else None,
        # Both APIs honour the client's key; none is derived when it sends none.
        idempotency_key=request_key(request, source, item),
        admit=admit,
    )
    # The answer carries them (TenantAPIView.finalize_response), the job just submitted counted.
    request.concurrency = submission.concurrency_headers(organization, auth)  # type: ignore[attr-defined]
    return submitted


class SpeechListView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "POST": "speech:write"}

    @extend_schema(
        request=SpeechRequestSerializer,
        responses={200: JobSerializer, 202: JobSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER)],
        summary="Create a synthesis job",
    )
    def post(self, request: Request) -> Response:
        _idempotency_key(request)  # a bad header is refused before the body is even read
        job, created = submit(request, self.organization, request.data, "api")
        location = reverse("api-speech-detail", args=[job.id])
        return self.job_response(job, 202 if created else 200, Location=location)

    @extend_schema(
        responses=JobPageSerializer,
        parameters=[
            OpenApiParameter("limit", OpenApiTypes.INT),
            OpenApiParameter("cursor", OpenApiTypes.STR),
            OpenApiParameter("status", OpenApiTypes.STR, enum=list(SynthesisJob.Status.values)),
        ],
        summary="Job history, newest first",
        operation_id="api_v1_speech_list",
    )
    def get(self, request: Request) -> Response:
        jobs_of_tenant = SynthesisJob.objects.filter(organization=self.organization, session__isnull=True)
        status = request.query_params.get("status")
        if status is not None:
            if status not in SynthesisJob.Status.values:
                raise DomainError(
                    ErrorCode.INVALID_STATUS,
                    f"status must be one of {', '.join(SynthesisJob.Status.values)}.",
                    field="status",
                )
            jobs_of_tenant = jobs_of_tenant.filter(status=status)
        paginator = JobCursorPagination()
        page = paginator.paginate_queryset(jobs_of_tenant, request, view=self) or []
        context: dict[str, Any] = {"request": request}
        return paginator.get_paginated_response(JobSerializer(page, many=True, context=context).data)


class SpeechDetailView(WaitingAPIView, TenantAPIView):
    required_scopes = {"GET": "speech:read", "DELETE": "speech:write"}

    @extend_schema(
        responses=JobSerializer,
        parameters=[
            OpenApiParameter("wait", OpenApiTypes.INT, description="Long-poll up to N seconds (capped).")
        ],
        summary="One job; ?wait=N waits for a change",
    )
    def get(self, request: Request, job_id: str) -> Response | Wait:
        job = self.get_job(job_id)
        wait = int_param(request, "wait", 0, 0, 10_000)
        wait = min(wait, settings.TTS_LONG_POLL_MAX_SECONDS)
        if not wait or job.is_finished:
            return self.job_response(job)
        # The answer is built after the wait (job_after_wait), from the job as it is then:
        # serialising it now (its queue position and ETA are queries) would be thrown away.
        seen = (job.status, float(job.progress))
        return Wait(job.pk, wait, lambda now: now != seen, slot=WaitSlot.take(self.organization, wait))

    @extend_schema(responses={204: None}, summary="Delete a job and its audio")
    def delete(self, request: Request, job_id: str) -> Response:
        lifecycle.delete_job(self.get_owned_job(job_id))
        return Response(status=204)


def _job_data(request: HttpRequest, job_id: Any) -> dict[str, Any] | None:
    """The job as it is now, serialised (None: deleted meanwhile)."""
    job = queries.job_row(job_id)
    return None if job is None else JobSerializer(job, context={"request": request}).data


def _job_answer(request: HttpRequest, wait: Wait, data: dict[str, Any] | None) -> HttpResponseBase:
    if data is None:
        return render(
            request, DomainError(ErrorCode.NOT_FOUND, f"No job {wait.job_id} in this organization.")
        )
    response = JsonResponse(data)
    for key, value in wait.headers.items():
        response[key] = value
    return response


# The long-poll's answer once its wait is over: the job as it is then, read once for all its waiters.
job_after_wait = SharedAnswer(build=_job_data, respond=_job_answer)
# GET, and DELETE: DRF's dispatch in a thread; GET ?wait=N on a job still going then waits here.
speech_detail = wait_view(SpeechDetailView.as_view(), job_after_wait)


class SpeechCancelView(TenantAPIView):
    required_scopes = {"POST": "speech:write"}

    @extend_schema(request=None, responses=JobSerializer, summary="Cancel a queued or running job")
    def post(self, request: Request, job_id: str) -> Response:
        job = lifecycle.cancel_job(self.get_owned_job(job_id))
        return self.job_response(job)


class SpeechAudioView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY}, summary="The job's audio"
    )
    def get(self, request: Request, job_id: str) -> HttpResponse:
        job = self.get_job(job_id)
        if job.status == SynthesisJob.Status.EXPIRED:
            raise DomainError(
                ErrorCode.AUDIO_EXPIRED, "This job's audio passed its retention period and was deleted."
            )
        if job.status != SynthesisJob.Status.SUCCEEDED or not job.audio_path:
            raise DomainError(
                ErrorCode.AUDIO_NOT_READY, f"The job is {job.status}; audio exists once it has succeeded."
            )
        response = HttpResponse(content_type=content_type(job.format))
        # Nginx streams the file from its internal location (Range requests included).
        response["X-Accel-Redirect"] = settings.TTS_ACCEL_REDIRECT_PREFIX + quote(job.audio_path)
        response["Content-Disposition"] = f'attachment; filename="{job.id}.{job.format}"'
        response["Cache-Control"] = "private, no-store"
        return response


# --------------------------------------------------------------------- usage and docs


class UsageView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses=UsageSerializer,
        summary="Plan, period, characters, jobs, storage, daily totals",
        description="With any of group_by, from and to, also `usage`: the charged characters over the "
        "range of UTC days, grouped (docs/api.md, GET /api/v1/usage).",
        parameters=[
            OpenApiParameter("group_by", OpenApiTypes.STR, enum=list(reports.GROUPS)),
            OpenApiParameter("from", OpenApiTypes.DATE, description="First UTC day (default: this month's)."),
            OpenApiParameter("to", OpenApiTypes.DATE, description="Last UTC day, included (default: today)."),
        ],
    )
    def get(self, request: Request) -> Response:
        summary = reports.summary(self.organization)
        params = request.query_params
        if any(name in params for name in ("group_by", "from", "to")):
            group, start, end = reports.parse(params.get("group_by"), params.get("from"), params.get("to"))
            summary["usage"] = reports.breakdown(self.organization, group, start, end).as_json()
        return Response(summary)


class PublicSchemaView(SpectacularAPIView):
    """The schema is public: it describes the API, holds no tenant data.

    Built once per process: generating it walks every view and serializer (tens of
    milliseconds of CPU), and anyone may ask for it. One version and one language:
    ``?version=`` and ``?lang=`` cannot ask for another variant to be built.
    """

    authentication_classes: list[type] = []
    permission_classes: list[type] = []

    def _get_schema_response(self, request: Request) -> Response:
        with _schema_lock:
            if not _schema:
                generator = self.generator_class(urlconf=self.urlconf, patterns=self.patterns)
                _schema.append(generator.get_schema(request=request, public=self.serve_public))
        filename = self._get_filename(request, None)
        return Response(data=_schema[0], headers={"Content-Disposition": f'inline; filename="{filename}"'})


# The process's schema (PublicSchemaView), built by the first request that asks.
_schema: list[dict[str, Any]] = []
_schema_lock = threading.Lock()


class DocsView(SpectacularRedocView):
    """Redoc over the same schema, its bundle served from our static files (no CDN)."""

    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    template_name = "api/redoc.html"
    url_name = "api-schema"
