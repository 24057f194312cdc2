"""POST /api/v1/voices: upload a voice prompt (multipart), and what a voice object adds for uploads.

The web process never decodes the file: it checks the declared sizes, hands
the file to ``services.prompts.create_voice`` (which probes and converts it in
a limited child process) and answers 202 with the voice ``processing``; the
analysis worker makes it ``ready`` or ``rejected``. The client's file name is
never used: prompts are stored under generated names.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import UploadedFile
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem
from webapp.speech.api.serializers import VoiceSerializer
from webapp.speech.api.views import VoiceListView
from webapp.speech.models import Voice, VoiceConsent
from webapp.speech.services import consents, prompts
from webapp.speech.voices import forget_one_off
from webapp.tenants.models import ApiKey, Organization

# Multipart framing around the file; Nginx allows the same margin (deploy/nginx.py).
MULTIPART_MARGIN = 64 * 1024


def _form(request: Request) -> Any:
    """The multipart fields (a QueryDict: the parser allows nothing else)."""
    return request.data


def _field(request: Request, name: str, limit: int, required: bool = False) -> str:
    value = _form(request).get(name, "")
    if not isinstance(value, str) or len(value) > limit or (required and not value.strip()):
        need = f"1 to {limit}" if required else f"at most {limit}"
        raise DomainError(ErrorCode.INVALID_REQUEST, f"{name} must be text of {need} characters.", field=name)
    return value.strip()


def _consent(request: Request, organization: Any) -> VoiceConsent | None:
    """``consent=cons_…`` names a recorded consent (cloning needs one); ``consent=true`` is the
    uploader's own word that the speaker agreed, enough for a voice that is not cloned."""
    value = str(_form(request).get("consent", "")).strip()
    if value.startswith("cons_"):
        return consents.usable_consent(organization, value)
    if value.lower() not in ("true", "1", "yes", "on"):
        raise DomainError(
            ErrorCode.CONSENT_REQUIRED,
            "Name a recorded consent (consent=cons_...), or set consent=true to confirm that you have "
            "the speaker's permission to use their voice (a voice that is not cloned).",
            field="consent",
        )
    return None


def _audio(request: Request, limit: int, name: str) -> UploadedFile:
    audio = request.FILES.get(name)
    if not isinstance(audio, UploadedFile):
        raise DomainError(
            ErrorCode.INVALID_REQUEST, f"Attach the recording as the file field '{name}'.", field=name
        )
    if audio.size is not None and audio.size > limit:
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"The file is {audio.size:,} bytes; the limit is {limit:,}.",
            field=name,
        )
    return audio


def who(request: Request) -> tuple[Any, str]:
    """The user who confirmed consent (the key's user for an API key), and a label that outlives them."""
    key = request.auth if isinstance(request.auth, ApiKey) else None
    user = key.user if key is not None else request.user
    if not isinstance(user, get_user_model()):
        user = None
    label = (getattr(user, "email", "") or getattr(user, "username", "")) if user else ""
    if key is not None:
        label = f"{label} (API key {key.prefix})".strip()
    return user, label or "unknown"


@dataclass(frozen=True)
class UploadForm:
    """The multipart field names of an upload: ours (POST /api/v1/voices), or vLLM-Omni's."""

    audio: str = "audio"
    transcript: str = "transcript"
    description: str = "description"
    unique_name: bool = False  # a name the tenant's once (vLLM-Omni names its voices by it)


def upload_voice(
    request: Request,
    organization: Organization,
    form: UploadForm,
    check: Callable[[Request], None] | None = None,
) -> Voice:
    """The voice a multipart upload makes (``processing``): limits, fields, consent, then the decode.

    ``check``: the route's own refusals, once the upload was admitted (never before: a refused
    request still counts against the upload rate)."""
    admitted = prompts.admit_upload(organization)  # before the body is read
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    if declared > settings.TTS_MAX_UPLOAD_BYTES + MULTIPART_MARGIN:
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"The upload is {declared:,} bytes; the limit is {settings.TTS_MAX_UPLOAD_BYTES:,}.",
        )
    if check is not None:
        check(request)
    limit = prompts.upload_limit(organization)
    audio = _audio(request, limit, form.audio)
    name = _field(request, "name", Voice.MAX_NAME_CHARS, required=True)
    transcript = _field(request, form.transcript, Voice.MAX_TRANSCRIPT_CHARS)
    description = _field(request, form.description, Voice.MAX_DESCRIPTION_CHARS)
    consent = _consent(request, organization)
    mode = _form(request).get("cloning_mode") or None
    user, label = who(request)
    upload = prompts.VoiceUpload(name, transcript, mode, user, label, consent, description, form.unique_name)
    try:
        return prompts.create_voice_from_file(organization, audio, upload, admitted)
    except DomainError as exc:
        if exc.code == ErrorCode.QUOTA_EXCEEDED:
            # Waiting frees no voice slot, so not the 429 of the monthly quota.
            raise Problem(409, exc.code, exc.message, extra=exc.extra) from exc
        raise


class VoiceCollectionView(VoiceListView):
    """GET lists the voices (VoiceListView); POST uploads a prompt."""

    required_scopes = {"GET": "speech:read", "POST": "voices:write"}
    parser_classes = [MultiPartParser]

    @extend_schema(
        request={"multipart/form-data": {"type": "object"}},
        responses={202: dict},
        summary="Upload a voice prompt (3-15 s of speech, consent=true)",
    )
    def post(self, request: Request) -> Response:
        voice = upload_voice(request, self.organization, UploadForm())
        location = reverse("api-voice-detail", args=[voice.voice_id])
        return Response(VoiceSerializer(voice).data, status=202, headers={"Location": location})


def reference_voice(request: Request, organization: Organization, data: dict[str, Any]) -> Voice:
    """A request's ``ref_audio`` (a base64 ``data:`` URL) as a one-off voice, ready to clone: the
    upload's rate, size limit, decode sandbox and consent rules, then the analysis (the consent's
    speaker must be the prompt's), waited for up to ``TTS_OPENAI_VOICE_READY_SECONDS``."""
    admitted = prompts.admit_upload(organization)
    audio = _data_url_audio(str(data["ref_audio"]), prompts.upload_limit(organization))
    consent_id = str(data.get("consent") or "")
    if not consent_id.startswith("cons_"):
        raise DomainError(
            ErrorCode.CONSENT_REQUIRED,
            "Cloning ref_audio needs its speaker's recorded consent: record one (POST /v1/audio/voice_consents) "
            "and name it (consent: cons_...).",
            field="consent",
        )
    try:
        consent = consents.usable_consent(organization, consent_id)
    except DomainError as exc:
        exc.field = exc.field or "consent"
        raise
    user, label = who(request)
    upload = prompts.VoiceUpload(
        "Reference audio",
        str(data.get("ref_text") or ""),
        prompts.ZERO_SHOT,
        user,
        label,
        consent,
        one_off=True,
    )
    try:
        voice = prompts.create_voice_from_file(
            organization, ContentFile(audio, name="ref_audio"), upload, admitted
        )
    except DomainError as exc:
        if exc.field in ("audio", "cloning_mode"):
            exc.field = "ref_audio"
        raise
    voice = prompts.decided(voice, settings.TTS_OPENAI_VOICE_READY_SECONDS)
    if voice.status == Voice.Status.READY:
        return voice
    forget_one_off(organization, voice)
    if voice.status == Voice.Status.REJECTED:
        raise DomainError(
            prompts.rejection_error(voice.rejected_code), voice.status_reason, field="ref_audio"
        )
    raise DomainError(
        ErrorCode.VOICE_NOT_READY,
        f"The analysis of ref_audio did not finish within {settings.TTS_OPENAI_VOICE_READY_SECONDS:g} s; "
        "nothing was charged. Try again, or upload the voice once (POST /v1/audio/voices) and name it.",
        field="ref_audio",
    )


def _data_url_audio(url: str, limit: int) -> bytes:
    """The bytes of a base64 ``data:`` URL (the serializer checked its form), within ``limit``."""
    encoded = url.partition(",")[2]
    if len(encoded) > 4 * (limit // 3 + 1):
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"ref_audio is over the upload limit of {limit:,} bytes.",
            field="ref_audio",
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DomainError(
            ErrorCode.INVALID_AUDIO, "ref_audio is not valid base64.", field="ref_audio"
        ) from exc
