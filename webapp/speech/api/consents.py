"""Voice consents, in OpenAI's shape at ``/v1/audio/voice_consents`` and the same at ``/api/v1/voice_consents``.

``GET …/phrase`` issues a phrase to read (a random code, valid for minutes); ``POST`` takes
its recording (multipart: ``name``, ``language``, ``recording``, optional ``phrase``) and
keeps it once it passes the checks (webapp/speech/services/consents.py); ``GET`` lists and
reads them; ``DELETE`` revokes one (kept for audit, ``status: revoked``). The OpenAI wire
writes times as Unix seconds, the native one as ISO 8601.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.api_fields import iso
from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem
from webapp.speech import voices
from webapp.speech.api.serializers import VoiceSerializer
from webapp.speech.api.views import TenantAPIView, VoiceDetailView
from webapp.speech.api.voices import MULTIPART_MARGIN, who
from webapp.speech.models import ConsentPhrase, VoiceConsent
from webapp.speech.services import consents, prompts
from webapp.tenants import roles
from webapp.tenants.models import ApiKey
from webapp.tenants.services import key_role

# A tenant records a handful; the list is capped rather than paged.
LISTED = 500


def _time(request: Request, value: Any) -> Any:
    if value is None:
        return None
    return int(value.timestamp()) if request.path.startswith("/v1/") else iso(value)


def phrase_json(request: Request, phrase: ConsentPhrase) -> dict[str, Any]:
    return {
        "id": phrase.phrase_id,
        "object": "audio.voice_consent_phrase",
        "language": phrase.language,
        "text": phrase.text,
        "code": phrase.code,
        "checked": consents.checked_language(phrase.language),
        "expires_at": _time(request, phrase.expires_at),
    }


def consent_json(request: Request, consent: VoiceConsent) -> dict[str, Any]:
    return {
        "id": consent.consent_id,
        "object": "audio.voice_consent",
        "name": consent.name,
        "language": consent.language,
        "status": consent.status,
        "checked_by": consent.checked_by,
        "phrase": consent.phrase_text,
        "recording_sha256": consent.recording_sha256,
        "recording_seconds": consent.recording_seconds,
        "created_by": consent.created_by_label,
        "created_at": _time(request, consent.created_at),
        "revoked_at": _time(request, consent.revoked_at),
    }


def _actor(request: Request) -> Any:
    """Who acts, as the audit log names them: the key, or the signed-in user."""
    return request.auth if isinstance(request.auth, ApiKey) else request.user


def _role(request: Request, view: TenantAPIView) -> str | None:
    if isinstance(request.auth, ApiKey):
        return key_role(request.auth)
    return roles.role_of(request.user, view.organization)


class ConsentPhraseView(TenantAPIView):
    required_scopes = {"GET": "voices:write"}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="A consent phrase to read, with its code")
    def get(self, request: Request) -> Response:
        phrase = consents.issue_phrase(self.organization, request.query_params.get("language", "en"))
        return Response(phrase_json(request, phrase), headers={"Cache-Control": "no-store"})


@extend_schema_view(get=extend_schema(operation_id="api_v1_voice_consents_list"))
class ConsentCollectionView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "POST": "voices:write"}
    parser_classes = [MultiPartParser]

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="The tenant's voice consents")
    def get(self, request: Request) -> Response:
        rows = VoiceConsent.objects.filter(organization=self.organization).order_by("-created_at", "-id")
        data = [consent_json(request, c) for c in rows[:LISTED]]
        return Response({"object": "list", "data": data})

    @extend_schema(
        request={"multipart/form-data": {"type": "object"}},
        responses={201: OpenApiTypes.OBJECT},
        summary="Record a consent: the recording of a phrase, checked",
    )
    def post(self, request: Request) -> Response:
        admitted = prompts.admit_upload(self.organization)  # before the body is read, as a voice upload
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > settings.TTS_MAX_UPLOAD_BYTES + MULTIPART_MARGIN:
            raise DomainError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"The upload is {declared:,} bytes; the limit is {settings.TTS_MAX_UPLOAD_BYTES:,}.",
            )
        form: Any = request.data
        name = form.get("name", "")
        if not isinstance(name, str) or not name.strip() or len(name) > VoiceConsent.MAX_NAME_CHARS:
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                f"name must be text of 1 to {VoiceConsent.MAX_NAME_CHARS} characters.",
                field="name",
            )
        recording = request.FILES.get("recording")
        if not isinstance(recording, UploadedFile):
            raise DomainError(
                ErrorCode.INVALID_REQUEST,
                "Attach the recording as the file field 'recording'.",
                field="recording",
            )
        limit = prompts.upload_limit(self.organization)
        if recording.size is not None and recording.size > limit:
            raise DomainError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"The file is {recording.size:,} bytes; the limit is {limit:,}.",
                field="recording",
            )
        attested = str(form.get("attestation", "")).lower() in ("true", "1", "yes", "on")
        if attested and _role(request, self) != roles.Role.OWNER:
            raise Problem(403, ErrorCode.PERMISSION_DENIED, "Only an owner of the organization may attest.")
        user, label = who(request)
        asked = consents.ConsentRecording(
            name=name.strip(),
            language=str(form.get("language", "en")),
            phrase_id=str(form.get("phrase", "")),
            attested=attested,
            created_by=user,
            created_by_label=label,
            actor=_actor(request),
        )
        with prompts.spooled(recording) as path:
            consent = consents.record_consent(self.organization, path, asked, admitted)
        return Response(consent_json(request, consent), status=201)


@extend_schema_view(get=extend_schema(operation_id="v1_audio_voice_consents_list"))
class OpenAIConsentCollectionView(ConsentCollectionView):
    """The same, at OpenAI's path (its own operation in the schema)."""


class ConsentDetailView(TenantAPIView):
    required_scopes = {"GET": "speech:read", "DELETE": "voices:write"}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="One voice consent")
    def get(self, request: Request, consent_id: str) -> Response:
        return Response(consent_json(request, consents.get_consent(self.organization, consent_id)))

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="Revoke a voice consent (kept for audit)")
    def delete(self, request: Request, consent_id: str) -> Response:
        _user, label = who(request)
        consent = voices.revoke_consent(self.organization, consent_id, label, _actor(request))
        return Response(consent_json(request, consent))


class VoiceConsentView(VoiceDetailView):
    """``POST /api/v1/voices/{id}/consent`` ``{"consent": "cons_…"}``: an uploaded voice becomes cloneable."""

    required_scopes = {"POST": "voices:write"}
    http_method_names = ["post", "options"]

    @extend_schema(
        request={"application/json": {"type": "object", "properties": {"consent": {"type": "string"}}}},
        responses={200: VoiceSerializer},
        summary="Name a recorded consent on an uploaded voice",
    )
    def post(self, request: Request, voice_id: str) -> Response:
        consent_id = request.data.get("consent") if isinstance(request.data, dict) else None
        if not isinstance(consent_id, str) or not consent_id.startswith("cons_"):
            raise DomainError(
                ErrorCode.INVALID_REQUEST, "consent must be a consent id (cons_...).", field="consent"
            )
        voice = voices.add_consent(self.organization, self.get_voice(voice_id), consent_id, _actor(request))
        return Response(VoiceSerializer(voice).data)
