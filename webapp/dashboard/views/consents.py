"""The Consents page: a tenant's recorded voice consents, recording one from the microphone, revoking one.

It stands on the same services as ``/api/v1/voice_consents`` (``services.consents`` and
``speech.voices``), so the checks, limits and messages are the API's. The page's script
(app.js) asks for a phrase and posts the recording as multipart; both answer JSON, errors
as problem+json. Who may record or revoke is who may use the API's ``voices:write`` scope;
only an owner may attest a recording in a language the recogniser cannot check.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import messages
from django.core.files.uploadedfile import UploadedFile
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from webapp import problems
from webapp.dashboard.access import Tenant, error_text, tenant_page
from webapp.dashboard.views.voices import VOICE_WRITERS, uploader_label
from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem
from webapp.speech import voices
from webapp.speech.models import Voice, VoiceConsent
from webapp.speech.services import consents, prompts
from webapp.tenants import ratelimit
from webapp.tenants.models import Membership

# A tenant records a handful; the page lists the newest (the API's list has the same cap).
LISTED = 500
ATTESTED_VALUES = ("on", "true", "1", "yes")


def _languages(tenant: Tenant) -> list[tuple[str, bool]]:
    """The languages offered for a phrase: English and those of the built-in voices, each with
    whether speech recognition checks it."""
    tags = set(
        Voice.objects.filter(organization__isnull=True, status=Voice.Status.READY)
        .exclude(language="")
        .values_list("language", flat=True)
    )
    tags.add("en")
    return [(tag, consents.checked_language(tag)) for tag in sorted(tags, key=lambda t: (t != "en", t))]


@tenant_page()
@require_GET
def consent_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    rows = VoiceConsent.objects.filter(organization=tenant.organization).order_by("-created_at", "-id")
    context = {
        "tenant": tenant,
        "consents": list(rows[:LISTED]),
        "can_record": tenant.role in VOICE_WRITERS,
        "can_attest": tenant.role == Membership.Role.OWNER,
        "languages": _languages(tenant),
    }
    return render(request, "dashboard/consents.html", context)


def _phrase_json(phrase: Any) -> dict[str, Any]:
    return {
        "id": phrase.phrase_id,
        "language": phrase.language,
        "text": phrase.text,
        "code": phrase.code,
        "checked": consents.checked_language(phrase.language),
        "expires_at": phrase.expires_at.isoformat(),
    }


@tenant_page(roles=VOICE_WRITERS, verified=True)
@require_POST
def consent_phrase(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """A new phrase to read (JSON ``{"language": "en"}``), as ``GET /api/v1/voice_consents/phrase``."""
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        body = None
    language = body.get("language", "en") if isinstance(body, dict) else None
    try:
        if not isinstance(language, str):
            raise DomainError(ErrorCode.INVALID_REQUEST, 'Send a JSON object such as {"language": "en"}.')
        ratelimit.check_rate(request, tenant.organization)
        phrase = consents.issue_phrase(tenant.organization, language)
    except (DomainError, Problem) as exc:
        return problems.render(request, exc)
    response = JsonResponse(_phrase_json(phrase))
    response["Cache-Control"] = "no-store"
    return response


def _name(request: HttpRequest) -> str:
    name = request.POST.get("name", "").strip()
    if not name or len(name) > VoiceConsent.MAX_NAME_CHARS:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"Write the speaker's name (1 to {VoiceConsent.MAX_NAME_CHARS} characters).",
            field="name",
        )
    return name


def _recording(request: HttpRequest, tenant: Tenant) -> UploadedFile:
    recording = request.FILES.get("recording")
    if not isinstance(recording, UploadedFile):
        raise DomainError(ErrorCode.INVALID_REQUEST, "Record the phrase first.", field="recording")
    limit = prompts.upload_limit(tenant.organization)
    if recording.size is not None and recording.size > limit:
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"The recording is {recording.size:,} bytes; the limit is {limit:,}.",
            field="recording",
        )
    return recording


@tenant_page(roles=VOICE_WRITERS, verified=True)
@require_POST
def consent_record(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """The recording of a phrase (multipart: ``name``, ``language``, ``phrase``, ``recording``,
    ``attestation``), checked and kept as ``POST /api/v1/voice_consents`` does."""
    try:
        # Counted like an upload from a key: the tenant's request rate, then its upload rate.
        ratelimit.check_rate(request, tenant.organization)
        admitted = prompts.admit_upload(tenant.organization)
        name = _name(request)
        recording = _recording(request, tenant)
        attested = request.POST.get("attestation", "").lower() in ATTESTED_VALUES
        if attested and tenant.role != Membership.Role.OWNER:
            raise Problem(
                403, ErrorCode.PERMISSION_DENIED, "Only an owner of the organisation may attest a recording."
            )
        asked = consents.ConsentRecording(
            name=name,
            language=request.POST.get("language", "en"),
            phrase_id=request.POST.get("phrase", ""),
            attested=attested,
            created_by=request.user,
            created_by_label=uploader_label(request),
            actor=request.user,
        )
        with prompts.spooled(recording) as path:
            consent = consents.record_consent(tenant.organization, path, asked, admitted)
    except (DomainError, Problem) as exc:
        return problems.render(request, exc)
    messages.success(request, f"The consent of “{consent.name}” is recorded ({consent.consent_id}).")
    data = {"id": consent.consent_id, "name": consent.name, "status": consent.status}
    return JsonResponse(data, status=201)


def _own_consent(tenant: Tenant, pk: uuid.UUID) -> VoiceConsent:
    consent = VoiceConsent.objects.filter(organization=tenant.organization, pk=pk).first()
    if consent is None:
        raise Http404("No such consent.")
    return consent


@tenant_page(roles=VOICE_WRITERS)
@require_POST
def consent_revoke(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    consent = _own_consent(tenant, pk)
    try:
        voices.revoke_consent(tenant.organization, consent.consent_id, uploader_label(request), request.user)
    except (DomainError, Problem) as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(
            request, f"The consent of “{consent.name}” is revoked: its voices are not cloned any more."
        )
    return redirect("dashboard:consents")
