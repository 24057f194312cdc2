"""Synthesize and history: pages, plus the small JSON endpoints the page's script calls.

The script posts JSON (with the CSRF header) and long-polls the job: each
poll waits up to ``WAIT_SECONDS`` for a change, and the script never starts
two polls less than a second apart.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import uuid
from itertools import groupby
from typing import Any, cast
from urllib.parse import quote

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Exists, OuterRef
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from redis.exceptions import RedisError
from rest_framework.exceptions import ValidationError

from synth.audio import content_type
from webapp import problems
from webapp.dashboard.access import WRITERS, Page, Tenant, error_text, tenant_page
from webapp.dashboard.forms import HistoryFilterForm
from webapp.dashboard.quota import quota_of
from webapp.errors import DomainError
from webapp.problems import Problem
from webapp.speech import lifecycle, submission
from webapp.speech.models import JobTimestamps, SynthesisJob, Voice
from webapp.speech.requests import SpeechRequestSerializer
from webapp.speech.services import captions, queries
from webapp.speech.services.jobview import JobView
from webapp.speech.services.ledger import reports
from webapp.speech.services.ledger.reports import Report
from webapp.speech.services.waiting import Prepare, SharedAnswer, Wait, WaitSlot, wait_view
from webapp.speech.submission import FORMATS
from webapp.tenants import ratelimit

WAIT_SECONDS = 10
PAGE_SIZE = 20
SUBMIT_FIELDS = ("text", "voice", "format", "speed", "instructions")
CAPTION_TYPES = {"srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}


def _voices(tenant: Tenant) -> list[Voice]:
    return list(queries.visible_voices(tenant.organization).order_by("language", "name", "voice_id"))


def by_language(voices: list[Voice]) -> list[tuple[str, list[Voice]]]:
    return [(language, list(group)) for language, group in groupby(voices, key=lambda v: v.language)]


@tenant_page(verified=True)
@require_GET
def synthesize(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    quota = quota_of(tenant.organization)
    plan = tenant.organization.plan
    prefill = _prefill(request, tenant)
    context = {
        "tenant": tenant,
        "languages": by_language(_voices(tenant)),
        "default_voice": prefill.get("voice") or settings.TTS_DEFAULT_VOICE,
        "prefill": prefill,
        "formats": FORMATS,
        "max_chars": plan.max_characters_per_request,
        "monthly_left": quota.remaining,
        "quota": quota,
    }
    return render(request, "dashboard/synthesize.html", context)


def _prefill(request: HttpRequest, tenant: Tenant) -> dict[str, Any]:
    """``?from_job=<id>``: the form filled from one of the tenant's jobs ("edit and re-render")."""
    raw = request.GET.get("from_job", "")
    if not raw:
        return {}
    try:
        job_id = uuid.UUID(raw)
    except ValueError:
        raise Http404("No such job.") from None
    job = _job(tenant, job_id)
    params = job.params or {}
    return {
        "job": job,
        "text": job.text,
        "voice": job.voice_name,
        "format": job.format,
        "speed": params.get("speed") or 1,
        "instructions": params.get("instructions") or "",
    }


# The page's script reads the same problem+json as the API's clients (webapp/problems.py).
def _error(request: HttpRequest, status: int, message: str) -> JsonResponse:
    return problems.render(request, Problem(status, problems.code_for_status(status), message))


def _service_error(request: HttpRequest, exc: DomainError | Problem) -> JsonResponse:
    return problems.render(request, exc)


def _validation_error(request: HttpRequest, exc: ValidationError) -> JsonResponse:
    return problems.render(request, problems.problem_from_drf(exc))


@tenant_page(roles=WRITERS, verified=True)
@require_POST
def submit(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _error(request, 400, "The request was not JSON.")
    if not isinstance(body, dict):
        return _error(request, 400, "The request was not a JSON object.")
    data = {k: v for k, v in body.items() if k in SUBMIT_FIELDS and v not in (None, "")}
    data.setdefault("text", "")
    try:
        # A submit from the page counts against the tenant's request rate like one from a key.
        ratelimit.check_rate(request, tenant.organization)
        context = {"organization": tenant.organization, "source": "dashboard"}
        serializer = SpeechRequestSerializer(data=data, context=context)
        serializer.is_valid(raise_exception=True)
        job, _ = submission.submit(tenant.organization, serializer.validated_data["job"], user=request.user)
    except ValidationError as exc:
        return _validation_error(request, exc)
    except (DomainError, Problem) as exc:
        return _service_error(request, exc)
    except RedisError:
        return _error(request, 503, "The job queue is unavailable; try again in a few seconds.")
    return JsonResponse(JobView(job).for_dashboard(), status=202)


def _job(tenant: Tenant, job_id: uuid.UUID) -> SynthesisJob:
    job = SynthesisJob.objects.filter(pk=job_id, organization=tenant.organization).first()
    if job is None:
        raise Http404("No such job.")
    return job


def _may_change(request: HttpRequest, tenant: Tenant, job: SynthesisJob) -> bool:
    """Owners and admins act on any job of the tenant; a member only on jobs they submitted."""
    return tenant.can_manage or (tenant.can_write and job.user_id == request.user.pk)


def _job_status_or_wait(request: HttpRequest, tenant: Tenant, job_id: uuid.UUID) -> JsonResponse | Wait:
    """The job as it is; with ``?wait=N`` (up to 10 s) a wait for it to change first."""
    job = _job(tenant, job_id)
    wait = _wait_seconds(request.GET.get("wait", ""))
    if not wait or job.is_finished:
        return JsonResponse(JobView(job).for_dashboard())
    seen = (str(job.status), float(job.progress))
    # The tenant's cap on concurrent waits, as for the API's long-polls (429 too_many_waits).
    try:
        slot = WaitSlot.take(tenant.organization, wait)
    except DomainError as exc:
        return _service_error(request, exc)
    # The job as it was is the answer if it is deleted meanwhile.
    return Wait(job.pk, wait, lambda state: state != seen, slot=slot, seen=JobView(job).for_dashboard())


def _wait_seconds(raw: str) -> int:
    """``?wait=``'s seconds, at most WAIT_SECONDS; 0 for anything but plain digits.

    More digits than WAIT_SECONDS has is WAIT_SECONDS without int(): Python refuses to
    convert more than 4,300 digits (ValueError), which was a 500.
    """
    if not (raw.isascii() and raw.isdigit()):
        return 0
    if len(raw.lstrip("0")) > len(str(WAIT_SECONDS)):
        return WAIT_SECONDS
    return min(WAIT_SECONDS, int(raw))


def _job_status_data(request: HttpRequest, job_id: Any) -> dict[str, Any] | None:
    job = SynthesisJob.objects.filter(pk=job_id).first()  # the tenant was checked before the wait
    return None if job is None else JobView(job).for_dashboard()


def _job_status_answer(request: HttpRequest, wait: Wait, data: dict[str, Any] | None) -> HttpResponseBase:
    return JsonResponse(wait.seen if data is None else data)


# tenant_page and require_GET pass on what the view returns, a Wait too.
_job_status = cast(Prepare, tenant_page()(require_GET(cast(Page, _job_status_or_wait))))
job_status = wait_view(_job_status, SharedAnswer(_job_status_data, _job_status_answer))


@tenant_page()
@require_POST
def job_cancel(request: HttpRequest, tenant: Tenant, job_id: uuid.UUID) -> JsonResponse:
    job = _job(tenant, job_id)
    if not _may_change(request, tenant, job):
        return _error(request, 403, "You can cancel only jobs you started.")
    try:
        job = lifecycle.cancel_job(job)
    except (DomainError, Problem) as exc:
        return _service_error(request, exc)
    return JsonResponse(JobView(job).for_dashboard())


@tenant_page()
@require_GET
def job_audio(request: HttpRequest, tenant: Tenant, job_id: uuid.UUID) -> HttpResponse:
    """Django checks the tenant; Nginx streams the file from its internal location."""
    job = _job(tenant, job_id)
    if job.status != SynthesisJob.Status.SUCCEEDED or not job.audio_path:
        return HttpResponse("This job has no audio (any more).", status=404, content_type="text/plain")
    response = HttpResponse(content_type=content_type(job.format))
    response["X-Accel-Redirect"] = settings.TTS_ACCEL_REDIRECT_PREFIX + quote(job.audio_path)
    disposition = "attachment" if request.GET.get("download") else "inline"
    response["Content-Disposition"] = f'{disposition}; filename="{job.id}.{job.format}"'
    response["Cache-Control"] = "private, no-store"
    return response


@tenant_page()
@require_GET
def job_captions(request: HttpRequest, tenant: Tenant, job_id: uuid.UUID) -> HttpResponse:
    """The job's captions (``?format=srt`` or ``vtt``, a cue per sentence), as the API writes them."""
    job = _job(tenant, job_id)
    fmt = request.GET.get("format", "srt")
    row = JobTimestamps.objects.filter(job_id=job.id).first()
    if fmt not in CAPTION_TYPES or job.status != SynthesisJob.Status.SUCCEEDED or row is None:
        return HttpResponse("This job has no captions.", status=404, content_type="text/plain")
    data = JobView(job).for_timestamps(row.words, row.sentences)
    body = captions.srt_captions(data) if fmt == "srt" else captions.vtt_captions(data)
    response = HttpResponse(body, content_type=CAPTION_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{job.id}.{fmt}"'
    response["Cache-Control"] = "private, no-store"
    return response


@tenant_page()
@require_POST
def job_delete(request: HttpRequest, tenant: Tenant, job_id: uuid.UUID) -> HttpResponse:
    job = _job(tenant, job_id)
    if not _may_change(request, tenant, job):
        messages.error(request, "You can delete only jobs you started.")
    else:
        try:
            lifecycle.delete_job(job)
        except (DomainError, Problem) as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(request, "The job and its audio are deleted.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = reverse("dashboard:history")
    return redirect(target)


def _utc_midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0), tzinfo=dt.UTC)


@tenant_page()
@require_GET
def history(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    all_jobs = SynthesisJob.objects.filter(organization=tenant.organization, session__isnull=True)
    voices = sorted(set(all_jobs.values_list("voice_name", flat=True).distinct()))
    form = HistoryFilterForm(request.GET or None, statuses=list(SynthesisJob.Status.values), voices=voices)
    selected = all_jobs
    if form.is_valid():
        if form.cleaned_data["q"]:
            selected = selected.filter(text__icontains=form.cleaned_data["q"])
        if form.cleaned_data["status"]:
            selected = selected.filter(status=form.cleaned_data["status"])
        if form.cleaned_data["voice"]:
            selected = selected.filter(voice_name=form.cleaned_data["voice"])
        if form.cleaned_data["source"]:
            selected = selected.filter(source=form.cleaned_data["source"])
        if form.cleaned_data["created_from"]:
            selected = selected.filter(created_at__gte=_utc_midnight(form.cleaned_data["created_from"]))
        if form.cleaned_data["created_to"]:
            after = form.cleaned_data["created_to"] + dt.timedelta(days=1)
            selected = selected.filter(created_at__lt=_utc_midnight(after))
    elif form.is_bound:
        selected = all_jobs.none()
    has_captions = Exists(JobTimestamps.objects.filter(job_id=OuterRef("pk")))
    ordered = selected.annotate(has_captions=has_captions).order_by("-created_at", "-id")
    page = Paginator(ordered, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"tenant": tenant, "form": form, "page": page, "query": query.urlencode()}
    return render(request, "dashboard/history.html", context)


GROUP_LABELS = {"day": "Day", "key": "API key", "voice": "Voice", "source": "Source", "member": "Member"}
PERIODS = {"this": "This month", "last": "Last month", "range": "Dates"}
# A cell that a spreadsheet would read as a formula: written with a leading apostrophe.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _report(request: HttpRequest, tenant: Tenant) -> tuple[dict[str, str], Report | None, str]:
    """The explorer's choices (from the query), its report, and what was wrong with the choices."""
    today = timezone.now().astimezone(dt.UTC).date()
    period = request.GET.get("period", "this")
    period = period if period in PERIODS else "this"
    group = request.GET.get("group_by", "day")
    if period == "range":
        start, end = request.GET.get("from") or None, request.GET.get("to") or None
    else:
        first, last = reports.last_month(today) if period == "last" else reports.this_month(today)
        start, end = first.isoformat(), last.isoformat()
    choices = {"period": period, "group_by": group, "from": start or "", "to": end or ""}
    try:
        group, first, last = reports.parse(group, start, end, today=today)
    except DomainError as exc:
        return choices, None, exc.message
    choices.update({"from": first.isoformat(), "to": last.isoformat()})
    return choices, reports.breakdown(tenant.organization, group, first, last), ""


def _chart(report: Report | None) -> tuple[list[dict[str, Any]], int]:
    """Bars for the report's rows (the per-day chart's drawing, for any grouping), and the chart's width."""
    rows = report.rows if report else []
    peak = max([row.characters for row in rows] + [1])
    bars = []
    for i, row in enumerate(rows):
        height = round(100 * row.characters / peak)
        bars.append({"row": row, "height": height, "x": i * 22, "y": 110 - height})
    return bars, max(1, len(bars)) * 22


@tenant_page()
@require_GET
def usage(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    summary = reports.summary(tenant.organization, days=1)
    choices, report, problem = _report(request, tenant)
    bars, width = _chart(report)
    status_counts = list(
        SynthesisJob.objects.filter(organization=tenant.organization)
        .values_list("status")
        .order_by("status")
        .annotate(n=Count("id"))
    )
    running = SynthesisJob.objects.filter(organization=tenant.organization, status__in=SynthesisJob.ACTIVE)
    query = request.GET.copy()
    context = {
        "tenant": tenant,
        "summary": summary,
        "plan": tenant.organization.plan,
        "quota": quota_of(tenant.organization),
        "choices": choices,
        "periods": PERIODS,
        "groups": GROUP_LABELS,
        "report": report,
        "problem": problem,
        "group_label": GROUP_LABELS.get(choices["group_by"], "Group"),
        "bars": bars,
        "chart_width": width,
        "export_query": query.urlencode(),
        "status_counts": status_counts,
        "running": running.order_by("created_at")[:20],
    }
    return render(request, "dashboard/usage.html", context, status=400 if problem else 200)


def csv_cell(value: object) -> str:
    """A value as a CSV cell a spreadsheet shows as text: one that starts like a formula gets a ' first."""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


@tenant_page()
@require_GET
def usage_export(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The usage page's table as CSV: the same choices, the same rows, the same total."""
    choices, report, problem = _report(request, tenant)
    if report is None:
        return HttpResponse(problem, status=400, content_type="text/plain; charset=utf-8")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"usage-{report.group_by}-{report.start}-{report.end}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["Cache-Control"] = "private, no-store"
    writer = csv.writer(response)
    writer.writerow([GROUP_LABELS[report.group_by], "Characters", "Cached characters", "Jobs"])
    for row in report.rows:
        writer.writerow([csv_cell(row.label), row.characters, row.cached_characters, row.jobs])
    writer.writerow(["Total", report.characters, report.cached_characters, report.jobs])
    return response
