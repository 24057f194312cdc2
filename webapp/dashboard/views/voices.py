"""The Voices page: the voices a tenant can use, and uploading and deleting its own.

Uploads go through ``services.prompts.create_voice``, the function behind
``POST /api/v1/voices``, so the limits and their messages are the API's. Who
may upload or delete is who may use the API's ``voices:write`` scope.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from webapp.dashboard.access import Tenant, error_text, tenant_page
from webapp.dashboard.forms import VoiceUploadForm
from webapp.dashboard.views.speech import by_language
from webapp.errors import DomainError, ErrorCode
from webapp.problems import Problem
from webapp.speech.models import Voice
from webapp.speech.services import consents, prompts, queries
from webapp.speech.voices import add_consent, delete_voice
from webapp.tenants import ratelimit
from webapp.tenants.models import ApiKey, Membership
from webapp.tenants.roles import role_allows

VOICE_WRITERS = tuple(r for r in Membership.Role.values if role_allows(r, ApiKey.Scope.VOICES_WRITE))


@dataclass(frozen=True)
class OwnVoice:
    """An uploaded voice as the page shows it: its state and its mode in words."""

    voice: Voice
    state: str
    mode: str


def _mode_words(voice: Voice, names: dict[str, str]) -> str:
    if voice.cloning_mode == prompts.APPROXIMATE:
        if voice.status != Voice.Status.READY or not voice.closest_voice:
            return "closest voice (chosen when the analysis finishes)"
        return f"closest voice: {names.get(voice.closest_voice, voice.closest_voice)}"
    if voice.cloning_mode == prompts.ZERO_SHOT:
        return "zero-shot"
    return "-"


def _state_words(voice: Voice) -> str:
    if voice.status == Voice.Status.PROCESSING:
        return "processing: the recording is being analysed"
    if voice.status == Voice.Status.REJECTED:
        return f"rejected: {voice.status_reason or 'the recording could not be used'}"
    return str(voice.status)


def uploader_label(request: HttpRequest) -> str:
    """Who acts, in words that outlive the user row."""
    return str(request.user.email or request.user.get_username())  # type: ignore[union-attr]


def _context(tenant: Tenant, form: VoiceUploadForm) -> dict[str, object]:
    usable = list(queries.visible_voices(tenant.organization).order_by("language", "name", "voice_id"))
    builtin = [v for v in usable if v.organization_id is None]
    names = {v.voice_id: v.name for v in builtin}
    own = (
        Voice.objects.filter(organization=tenant.organization, one_off=False)
        .select_related("consent")
        .order_by("-created_at", "name")
    )
    return {
        "tenant": tenant,
        "languages": by_language(builtin),
        "own": [OwnVoice(v, _state_words(v), _mode_words(v, names)) for v in own],
        "modes": prompts.cloning_modes(),
        "can_upload": tenant.role in VOICE_WRITERS,
        "form": form,
        "consents": form.consent_choices,
        "max_voices": tenant.organization.plan.max_voices,
    }


@tenant_page()
@require_GET
def voices(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = VoiceUploadForm(consents=consents.usable_consents(tenant.organization))
    return render(request, "dashboard/voices.html", _context(tenant, form))


def _create(request: HttpRequest, tenant: Tenant, form: VoiceUploadForm, admitted: prompts.Admitted) -> Voice:
    data = form.cleaned_data
    chosen = data["recorded_consent"]
    consent = consents.usable_consent(tenant.organization, chosen) if chosen else None
    upload = prompts.VoiceUpload(
        data["name"].strip(), data["transcript"].strip(), None, request.user, uploader_label(request), consent
    )
    return prompts.create_voice_from_file(tenant.organization, data["audio"], upload, admitted)


@tenant_page(roles=VOICE_WRITERS, verified=True)
@require_POST
def voice_upload(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = VoiceUploadForm(
        request.POST, request.FILES, consents=consents.usable_consents(tenant.organization)
    )
    status, retry_after = 400, None
    valid = form.is_valid()  # first: an error is added to a checked form
    try:
        # An upload from the page counts against the tenant's request rate like one from a key
        # (and against its upload rate and decode slots in the service, as the API's does).
        ratelimit.check_rate(request, tenant.organization)
        admitted = prompts.admit_upload(tenant.organization)
        if valid:
            voice = _create(request, tenant, form, admitted)
            messages.success(request, f"“{voice.name}” is uploaded; it is being analysed.")
            return redirect("dashboard:voices")
    except (DomainError, Problem) as exc:
        problem = Problem.of(exc)
        form.add_error(problem.field if problem.field in form.fields else None, error_text(exc))
        if problem.status in (429, 503):  # a limit: the page says so with the API's status
            status, retry_after = problem.status, problem.retry_after
    response = render(request, "dashboard/voices.html", _context(tenant, form), status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


@tenant_page(roles=VOICE_WRITERS)
@require_POST
def voice_delete(request: HttpRequest, tenant: Tenant, pk: str) -> HttpResponse:
    voice = Voice.objects.filter(organization=tenant.organization, pk=pk).first()
    if voice is None:
        raise Http404("No such voice.")
    try:
        delete_voice(tenant.organization, voice)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"“{voice.name}” and its recording are deleted.")
    return redirect("dashboard:voices")


@tenant_page(roles=VOICE_WRITERS)
@require_POST
def voice_consent(request: HttpRequest, tenant: Tenant, pk: str) -> HttpResponse:
    """Name a recorded consent on a voice uploaded without one (``POST /api/v1/voices/{id}/consent``)."""
    voice = Voice.objects.filter(organization=tenant.organization, pk=pk).first()
    if voice is None:
        raise Http404("No such voice.")
    consent_id = request.POST.get("consent", "")
    if not consent_id.startswith("cons_"):
        messages.error(request, "Choose a recorded consent.")
        return redirect("dashboard:voices")
    try:
        updated = add_consent(tenant.organization, voice, consent_id, request.user)
    except DomainError as exc:
        if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.INVALID_ID):
            raise Http404("No such consent.") from None
        if exc.code == ErrorCode.CONSENT_NOT_READY:
            messages.error(request, f"{exc.message} Add it again shortly.")
        else:
            messages.error(request, error_text(exc))
    else:
        messages.success(request, f"“{updated.name}” now names its speaker's recorded consent.")
    return redirect("dashboard:voices")
