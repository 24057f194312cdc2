"""The Dictionaries page: a tenant's pronunciation dictionaries, their versions and rules, PLS in and out.

Every change goes through ``webapp.dictionaries.services``, the functions behind
``/api/v1/dictionaries``, so the plan's limits, the rule checks and the refusal
to delete a dictionary that unfinished jobs pin (409 dictionary_in_use) are the
API's, with its messages. Who may change them is who may use the API's
``voices:write`` scope; everyone else only reads.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.core.files.uploadedfile import UploadedFile
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from synth import lexicon
from webapp.dashboard.access import Tenant, error_text, tenant_page
from webapp.dashboard.forms import DictionaryForm, VersionForm, rule_lines
from webapp.dictionaries import pls, services
from webapp.dictionaries.models import Dictionary, DictionaryVersion
from webapp.errors import DomainError
from webapp.problems import Problem
from webapp.tenants.models import ApiKey, Membership
from webapp.tenants.roles import role_allows

DICTIONARY_WRITERS = tuple(r for r in Membership.Role.values if role_allows(r, ApiKey.Scope.VOICES_WRITE))
SERVICE_ERRORS = (DomainError, Problem)


def _can_change(tenant: Tenant) -> bool:
    return tenant.role in DICTIONARY_WRITERS


def _dictionary(tenant: Tenant, pk: uuid.UUID) -> Dictionary:
    dictionary = Dictionary.objects.filter(organization=tenant.organization, pk=pk).first()
    if dictionary is None:
        raise Http404("No such dictionary.")
    return dictionary


def _rules_of(tenant: Tenant, form: VersionForm) -> tuple[list[lexicon.Rule], str]:
    """The version's rules and language: the uploaded PLS document's, else the typed lines'."""
    upload: UploadedFile | None = form.cleaned_data.get("pls_file")
    if upload is not None:
        services.check_import_size(tenant.organization, upload.size or 0)
        limit = tenant.organization.plan.max_dictionary_import_bytes
        parsed = services.parse_import(tenant.organization, upload.read(limit + 1))
        return parsed.rules, parsed.language
    typed = form.cleaned_data["rules"]
    return [services.rule_of(r, n) for n, r in enumerate(typed, 1)], ""


def _form_error(form: VersionForm, exc: DomainError | Problem) -> None:
    problem = Problem.of(exc)
    field = (problem.field or "").split("[")[0]
    if form.cleaned_data.get("pls_file") is not None and field == "rules":
        field = "pls_file"
    form.add_error(field if field in form.fields else None, error_text(exc))


def _list_page(request: HttpRequest, tenant: Tenant, form: DictionaryForm, status: int = 200) -> HttpResponse:
    rows = Dictionary.objects.filter(organization=tenant.organization).order_by("name")
    plan = tenant.organization.plan
    context = {
        "tenant": tenant,
        "dictionaries": rows,
        "form": form,
        "can_change": _can_change(tenant),
        "max_dictionaries": plan.max_dictionaries,
        "max_rules": plan.max_dictionary_rules,
        "max_versions": plan.max_dictionary_versions,
    }
    return render(request, "dashboard/dictionaries.html", context, status=status)


@tenant_page()
@require_http_methods(["GET", "POST"])
def dictionaries(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The list, and (for those who may change them) a new dictionary with its version 1."""
    if request.method != "POST":
        return _list_page(request, tenant, DictionaryForm())
    if not _can_change(tenant):
        return render(request, "dashboard/forbidden.html", {"tenant": tenant}, status=403)
    form = DictionaryForm(request.POST, request.FILES)
    if not form.is_valid():
        return _list_page(request, tenant, form, status=400)
    try:
        rules, language = _rules_of(tenant, form)
        dictionary, version = services.create_dictionary(
            tenant.organization,
            form.cleaned_data["name"].strip(),
            rules,
            description=form.cleaned_data["description"].strip(),
            language=language,
            is_default=form.cleaned_data["is_default"],
        )
    except SERVICE_ERRORS as exc:
        _form_error(form, exc)
        return _list_page(request, tenant, form, status=Problem.of(exc).status)
    messages.success(
        request, f"“{dictionary.name}” is created with {version.rule_count:,} rules (version 1)."
    )
    return redirect("dashboard:dictionary", pk=dictionary.pk)


def _detail_page(
    request: HttpRequest,
    tenant: Tenant,
    dictionary: Dictionary,
    form: VersionForm | None = None,
    status: int = 200,
) -> HttpResponse:
    versions = list(services.versions_of(dictionary))
    wanted = request.GET.get("version", "")
    shown = next((v for v in versions if str(v.number) == wanted), versions[0] if versions else None)
    rules = list(shown.rules.all()) if shown is not None else []
    if form is None:
        latest = versions[0] if versions else None
        start = rules if latest is shown else (list(latest.rules.all()) if latest else [])
        form = VersionForm(initial={"rules": rule_lines(start)})
    context: dict[str, Any] = {
        "tenant": tenant,
        "dictionary": dictionary,
        "versions": versions,
        "shown": shown,
        "rules": rules,
        "form": form,
        "can_change": _can_change(tenant),
    }
    return render(request, "dashboard/dictionary.html", context, status=status)


@tenant_page()
@require_GET
def dictionary(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    return _detail_page(request, tenant, _dictionary(tenant, pk))


@tenant_page(roles=DICTIONARY_WRITERS)
@require_POST
def version_create(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    """The dictionary's next version, its rules in full; earlier versions stay as they were."""
    found = _dictionary(tenant, pk)
    form = VersionForm(request.POST, request.FILES)
    if not form.is_valid():
        return _detail_page(request, tenant, found, form, status=400)
    try:
        rules, language = _rules_of(tenant, form)
        version = services.add_version(tenant.organization, found, rules, language=language)
    except SERVICE_ERRORS as exc:
        _form_error(form, exc)
        return _detail_page(request, tenant, found, form, status=Problem.of(exc).status)
    messages.success(request, f"Version {version.number} is saved with {version.rule_count:,} rules.")
    return redirect("dashboard:dictionary", pk=found.pk)


@tenant_page()
@require_GET
def version_export(request: HttpRequest, tenant: Tenant, pk: uuid.UUID, number: int) -> HttpResponse:
    """A version as a PLS 1.0 document, as ``GET .../versions/{n}`` answers to ``Accept: application/pls+xml``."""
    found = _dictionary(tenant, pk)
    version = DictionaryVersion.objects.filter(dictionary=found, number=number).first()
    if version is None:
        raise Http404("No such version.")
    body = pls.export(services.synth_rules(version), version.language)
    response = HttpResponse(body, content_type=pls.MEDIA_TYPE)
    filename = f"{found.name}-v{version.number}.pls".replace('"', "")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@tenant_page(roles=DICTIONARY_WRITERS)
@require_POST
def dictionary_default(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    """Make it the tenant's default (``make=1``), or stop it being one."""
    found = _dictionary(tenant, pk)
    make = request.POST.get("make") == "1"
    try:
        services.update_dictionary(tenant.organization, found, is_default=make)
    except SERVICE_ERRORS as exc:
        messages.error(request, error_text(exc))
    else:
        if make:
            messages.success(request, f"“{found.name}” applies to every request that names no dictionary.")
        else:
            messages.success(request, f"“{found.name}” is no longer the default.")
    return redirect("dashboard:dictionary", pk=found.pk)


@tenant_page(roles=DICTIONARY_WRITERS)
@require_POST
def dictionary_delete(request: HttpRequest, tenant: Tenant, pk: uuid.UUID) -> HttpResponse:
    found = _dictionary(tenant, pk)
    try:
        services.delete_dictionary(tenant.organization, found)
    except SERVICE_ERRORS as exc:  # dictionary_in_use: unfinished jobs pin one of its versions
        messages.error(request, error_text(exc))
        return redirect("dashboard:dictionary", pk=found.pk)
    messages.success(request, f"“{found.name}” and its versions are deleted.")
    return redirect("dashboard:dictionaries")
