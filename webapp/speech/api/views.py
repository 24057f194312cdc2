"""REST API v1: views parse and authorise; speech.services changes state.

Every object is looked up inside the caller's tenant, so another tenant's
job or voice is a 404 on every endpoint, never a 403 and never the object.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import time
import uuid
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import escape
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from redis.exceptions import RedisError
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.problems import Problem
from webapp.speech import heartbeat, services
from webapp.speech.api import ratelimit
from webapp.speech.api.serializers import (
    JobPageSerializer,
    JobSerializer,
    SpeechRequestSerializer,
    UsageSerializer,
    VoiceSerializer,
    build_job_request,
)
from webapp.speech.models import SynthesisJob, Voice
from webapp.tenants.auth import has_scope
from webapp.tenants.models import ApiKey, Organization

CONTENT_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "pcm": "audio/pcm",
    "aac": "audio/aac",
}
MAX_IDEMPOTENCY_KEY = 255
DEFAULT_PAGE = 20
MAX_PAGE = 100
POLL_INTERVAL = 0.25
NO_WORKER_RETRY_AFTER = 30


def content_type_for(fmt: str) -> str:
    try:
        from synth.audio import CONTENT_TYPES as synth_types  # the library's own table when present

        return str(synth_types.get(fmt) or CONTENT_TYPES.get(fmt, "application/octet-stream"))
    except ImportError:
        return CONTENT_TYPES.get(fmt, "application/octet-stream")


class ScopePermission(permissions.BasePermission):
    """The key must carry the scope the view names for the method."""

    message = "This API key lacks the scope this endpoint needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        scope = view.required_scopes.get(request.method, "speech:read")
        if not has_scope(request, scope):
            self.message = f"This API key lacks the {scope!r} scope."
            return False
        return True


class TenantAPIView(APIView):
    """Authenticated, scoped, rate-limited per key; RateLimit headers on every answer."""

    permission_classes = [permissions.IsAuthenticated, ScopePermission]
    required_scopes: dict[str, str] = {}

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        request.rate_usage = ratelimit.check_rate(request, self.organization)  # type: ignore[attr-defined]

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        usage = getattr(request, "rate_usage", None)
        if usage is not None:
            for key, value in usage.headers().items():
                response[key] = value
        return super().finalize_response(request, response, *args, **kwargs)

    @property
    def organization(self) -> Organization:
        return self.request.user.organization  # type: ignore[union-attr]

    def get_job(self, job_id: str) -> SynthesisJob:
        try:
            pk = uuid.UUID(job_id)
        except ValueError:
            raise Problem(
                400, "invalid_id", f"{job_id[:60]!r} is not a job id; job ids are UUIDs.", field="id"
            ) from None
        job = SynthesisJob.objects.filter(pk=pk, organization=self.organization).first()
        if job is None:
            raise Problem(404, "not_found", f"No job {pk} in this organization.")
        return job

    def job_response(self, job: SynthesisJob, status: int = 200, **headers: str) -> Response:
        data = JobSerializer(job, context={"request": self.request}).data
        return Response(data, status=status, headers=headers or None)


# --------------------------------------------------------------------- voices


class VoiceListView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses=VoiceSerializer(many=True), summary="Voices this tenant may use")
    def get(self, request: Request) -> Response:
        voices = services.visible_voices(self.organization).order_by("organization_id", "engine", "voice_id")
        return Response({"results": VoiceSerializer(voices, many=True).data})


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
            raise Problem(404, "not_found", f"No voice {voice_id[:200]!r} for this organization.")
        return voice

    @extend_schema(responses=VoiceSerializer, summary="One voice")
    def get(self, request: Request, voice_id: str) -> Response:
        return Response(VoiceSerializer(self.get_voice(voice_id)).data)

    @extend_schema(responses={204: None}, summary="Delete one of this tenant's own voices")
    def delete(self, request: Request, voice_id: str) -> Response:
        services.delete_voice(self.organization, self.get_voice(voice_id))
        return Response(status=204)


# --------------------------------------------------------------------- speech


def _idempotency_key(request: Request) -> str | None:
    raw = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if raw is None:
        return None
    if not raw or len(raw) > MAX_IDEMPOTENCY_KEY:
        raise Problem(
            400,
            "invalid_idempotency_key",
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters; got {len(raw)}.",
            field="Idempotency-Key",
        )
    if not raw.isprintable() or not raw.isascii():
        raise Problem(
            400,
            "invalid_idempotency_key",
            "Idempotency-Key must be printable ASCII.",
            field="Idempotency-Key",
        )
    return raw


def require_worker_for(voice: Voice) -> None:
    """A submit for a voice no live worker serves is a 503, not a job that waits forever."""
    try:
        serving = heartbeat.serving_voices()
    except (RedisError, OSError) as exc:
        raise Problem(
            503, "service_unavailable", "The job queue is unavailable; try again shortly.", retry_after=5
        ) from exc
    if voice.voice_id not in serving:
        raise Problem(
            503,
            "no_worker",
            f"No synthesis worker serving voice {voice.voice_id} is running right now; try again later.",
            retry_after=NO_WORKER_RETRY_AFTER,
        )


def submit(request: Request, organization: Organization, data: Any, source: str) -> tuple[SynthesisJob, bool]:
    """Shared by /api/v1/speech and /v1/audio/speech: validate, check workers, submit."""
    if not isinstance(data, dict):
        raise Problem(400, "invalid_request", 'The body must be a JSON object, e.g. {"text": "Hello"}.')
    serializer = SpeechRequestSerializer(data=data)
    serializer.is_valid(raise_exception=True)
    job_request = build_job_request(organization, dict(serializer.validated_data), source=source)
    key = _idempotency_key(request) if source == "api" else None
    fingerprint = services.request_fingerprint(data)
    if key is not None:
        replay = services.idempotent_replay(organization, key, fingerprint)
        if replay is not None:
            return replay, False
    require_worker_for(job_request.voice)
    auth = request.auth if isinstance(request.auth, ApiKey) else None
    try:
        return services.submit_job(
            organization, job_request, api_key=auth, idempotency_key=key, fingerprint=fingerprint
        )
    except RedisError as exc:
        raise Problem(
            503, "service_unavailable", "The job queue is unavailable; try again shortly.", retry_after=5
        ) from exc


def _encode_cursor(job: SynthesisJob) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, ident = raw.partition("|")
        when = dt.datetime.fromisoformat(stamp)
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, uuid.UUID(ident)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Problem(
            400, "invalid_cursor", "The cursor is not one this API gave out.", field="cursor"
        ) from None


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise Problem(400, f"invalid_{name}", f"{name} must be an integer from {low} to {high}.", field=name)
    return int(raw)


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
        limit = _int_param(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        jobs = SynthesisJob.objects.filter(organization=self.organization)
        status = request.query_params.get("status")
        if status is not None:
            if status not in SynthesisJob.Status.values:
                raise Problem(
                    400,
                    "invalid_status",
                    f"status must be one of {', '.join(SynthesisJob.Status.values)}.",
                    field="status",
                )
            jobs = jobs.filter(status=status)
        cursor = request.query_params.get("cursor")
        if cursor:
            when, ident = _decode_cursor(cursor)
            jobs = jobs.filter(Q(created_at__lt=when) | Q(created_at=when, id__lt=ident))
        page = list(jobs.order_by("-created_at", "-id")[: limit + 1])
        next_url = None
        if len(page) > limit:
            page = page[:limit]
            params = {"limit": str(limit), "cursor": _encode_cursor(page[-1])}
            if status is not None:
                params["status"] = status
            next_url = request.build_absolute_uri(f"{request.path}?{urlencode(params)}")
        context: dict[str, Any] = {"request": request}
        return Response({"results": JobSerializer(page, many=True, context=context).data, "next": next_url})


class SpeechDetailView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "DELETE": "speech:write"}

    @extend_schema(
        responses=JobSerializer,
        parameters=[
            OpenApiParameter("wait", OpenApiTypes.INT, description="Long-poll up to N seconds (capped).")
        ],
        summary="One job; ?wait=N waits for a change",
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_job(job_id)
        wait = _int_param(request, "wait", 0, 0, 10_000)
        wait = min(wait, settings.TTS_LONG_POLL_MAX_SECONDS)
        if wait and not job.is_finished:
            job = self._wait_for_change(job, wait)
        return self.job_response(job)

    def _wait_for_change(self, job: SynthesisJob, seconds: int) -> SynthesisJob:
        """Poll the row cheaply until status or progress moves (or time is up)."""
        seen = (job.status, job.progress)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
            now = SynthesisJob.objects.filter(pk=job.pk).values_list("status", "progress").first()
            if now is None or now != seen:
                break
        return self.get_job(str(job.pk))

    @extend_schema(responses={204: None}, summary="Delete a job and its audio")
    def delete(self, request: Request, job_id: str) -> Response:
        services.delete_job(self.get_job(job_id))
        return Response(status=204)


class SpeechCancelView(TenantAPIView):
    required_scopes = {"POST": "speech:write"}

    @extend_schema(request=None, responses=JobSerializer, summary="Cancel a queued or running job")
    def post(self, request: Request, job_id: str) -> Response:
        job = services.cancel_job(self.get_job(job_id))
        return self.job_response(job)


class SpeechAudioView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY}, summary="The job's audio"
    )
    def get(self, request: Request, job_id: str) -> HttpResponse:
        job = self.get_job(job_id)
        if job.status == SynthesisJob.Status.EXPIRED:
            raise Problem(
                410, "audio_expired", "This job's audio passed its retention period and was deleted."
            )
        if job.status != SynthesisJob.Status.SUCCEEDED or not job.audio_path:
            raise Problem(
                409, "audio_not_ready", f"The job is {job.status}; audio exists once it has succeeded."
            )
        response = HttpResponse(content_type=content_type_for(job.format))
        # Nginx streams the file from its internal location (Range requests included).
        response["X-Accel-Redirect"] = settings.TTS_ACCEL_REDIRECT_PREFIX + quote(job.audio_path)
        response["Content-Disposition"] = f'attachment; filename="{job.id}.{job.format}"'
        response["Cache-Control"] = "private, no-store"
        return response


# --------------------------------------------------------------------- usage


class UsageView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses=UsageSerializer, summary="Plan, period, characters, jobs, storage, daily totals")
    def get(self, request: Request) -> Response:
        return Response(services.usage_summary(self.organization))


_DOCS_CACHE: dict[str, str] = {}


def _render_docs(schema: dict[str, Any]) -> str:
    """Server-rendered HTML of the schema: no scripts (CSP script-src 'self'), no CDN."""
    info = schema.get("info", {})
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(info.get('title', 'API'))}</title>",
        "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
        "code,pre{background:#f4f4f4;padding:0 .2em}.op{border-top:1px solid #ddd;padding:.6rem 0}"
        ".m{display:inline-block;min-width:4.5em;font-weight:bold}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left}</style></head><body>",
        f"<h1>{escape(info.get('title', 'API'))} <small>{escape(info.get('version', ''))}</small></h1>",
        f"<p>{escape(info.get('description', ''))}</p>",
        f"<p>Machine-readable schema: <a href='{escape(reverse('api-schema'))}'>OpenAPI 3</a>.</p>",
    ]
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            parts.append("<div class='op'>")
            parts.append(
                f"<h2 id='{escape(op.get('operationId', ''))}'><span class='m'>{method.upper()}</span>"
                f"<code>{escape(path)}</code></h2>"
            )
            if op.get("summary"):
                parts.append(f"<p>{escape(op['summary'])}</p>")
            params = op.get("parameters", [])
            if params:
                parts.append("<table><tr><th>parameter</th><th>in</th><th>type</th><th>description</th></tr>")
                for p in params:
                    typ = p.get("schema", {}).get("type", "")
                    parts.append(
                        f"<tr><td><code>{escape(p.get('name', ''))}</code></td><td>{escape(p.get('in', ''))}"
                        f"</td><td>{escape(typ)}</td><td>{escape(p.get('description', ''))}</td></tr>"
                    )
                parts.append("</table>")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                parts.append(f"<p>Body ({escape(media)}): <code>{escape(ref.rsplit('/', 1)[-1])}</code></p>")
                break
            codes = ", ".join(escape(code) for code in op.get("responses", {}))
            parts.append(f"<p>Responses: {codes}</p></div>")
    parts.append("<h2>Schemas</h2>")
    for name, comp in schema.get("components", {}).get("schemas", {}).items():
        props = comp.get("properties", {})
        fields = ", ".join(f"<code>{escape(k)}</code>" for k in props)
        parts.append(f"<p><b id='{escape(name)}'>{escape(name)}</b>: {fields}</p>")
    parts.append("</body></html>")
    return "".join(parts)


def docs_page(request: HttpRequest) -> HttpResponse:
    """Browsable docs rendered from the same schema /api/v1/schema serves."""
    if "html" not in _DOCS_CACHE:
        from drf_spectacular.generators import SchemaGenerator

        schema = SchemaGenerator().get_schema(request=None, public=True)
        _DOCS_CACHE["html"] = _render_docs(schema)
    return HttpResponse(_DOCS_CACHE["html"], content_type="text/html; charset=utf-8")
