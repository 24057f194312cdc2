"""Tenants and plans in the admin, with what only the speech side knows: usage and deletion.

Registered here rather than in ``webapp.tenants.admin`` because the usage
columns read the ledger and the jobs, and deleting a tenant goes through
``services.operator`` (tenants never import speech).

- Tenants: plan, this month's characters (used + reserved), active jobs and
  storage, in the changelist's one query (subqueries, not a query per row).
  The stock delete is off: it would run inside the admin's transaction and
  leave the files; **Delete tenant** asks for confirmation, then deletes
  everything through :func:`operator.delete_tenant`.
- Plans: editable; saving a change first shows its effect on the tenants on
  the plan (who would be over a new limit), and saves only when confirmed.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, F, IntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from webapp.errors import DomainError
from webapp.speech import operator
from webapp.speech.models import LIVE_JOBS, SynthesisJob, UsagePeriod, Voice
from webapp.speech.services import ledger
from webapp.tenants.models import Organization, Plan

# What a plan limit is compared with on each tenant (annotated by with_usage).
LIMIT_USAGE = {
    "monthly_characters": "month_characters",
    "max_concurrent_jobs": "active_jobs",
    "storage_bytes": "storage",
    "max_voices": "voice_count",
}


def _per_tenant(queryset: QuerySet[Any], **aggregate: Any) -> Any:
    """A correlated subquery: one aggregate of ``queryset``'s rows for the outer tenant, 0 when none."""
    grouped = queryset.filter(organization=OuterRef("pk")).order_by().values("organization")
    value = Subquery(grouped.annotate(n=next(iter(aggregate.values()))).values("n")[:1])
    return Coalesce(value, Value(0), output_field=IntegerField())


def with_usage(queryset: QuerySet[Organization]) -> QuerySet[Organization]:
    """Tenants with this month's characters, active jobs, storage and voices, in the same query."""
    month = UsagePeriod.objects.filter(period=ledger.period_start())
    tenant_voices = Voice.objects.exclude(status=Voice.Status.DELETED)
    return queryset.annotate(
        month_used=_per_tenant(month, n=Sum("characters_used")),
        month_characters=_per_tenant(month, n=Sum("characters_used") + Sum("characters_reserved")),
        active_jobs=_per_tenant(SynthesisJob.objects.filter(status__in=SynthesisJob.ACTIVE), n=Count("id")),
        # As a submit's limits count it (ledger.storage_used).
        storage=_per_tenant(
            SynthesisJob.objects.filter(LIVE_JOBS), n=Sum(F("audio_bytes") + F("timestamps_bytes"))
        )
        + _per_tenant(Voice.objects.all(), n=Sum("prompt_bytes"))
        + F("sentence_cache_used"),
        voice_count=_per_tenant(tenant_voices, n=Count("id")),
    )


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "slug",
        "plan",
        "characters_this_month",
        "active_jobs",
        "storage",
        "is_active",
        "created_at",
    )
    list_filter = ("plan", "is_active")
    list_select_related = ("plan",)
    search_fields = ("name", "slug", "=id")
    actions = ["delete_tenants"]
    # Counted by the workers and housekeeping (webapp/speech/services/sentence_cache.py), not typed in.
    readonly_fields = ("sentence_cache_used",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Organization]:
        return with_usage(super().get_queryset(request))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # only through "Delete tenant", which removes the files too

    @admin.display(description="characters this month (used / plan)", ordering="month_characters")
    def characters_this_month(self, org: Organization) -> str:
        return f"{org.month_used:,} / {org.plan.monthly_characters:,}"  # type: ignore[attr-defined]

    @admin.display(description="active jobs", ordering="active_jobs")
    def active_jobs(self, org: Organization) -> int:
        return int(org.active_jobs)  # type: ignore[attr-defined]

    @admin.display(description="storage (bytes)", ordering="storage")
    def storage(self, org: Organization) -> str:
        return f"{org.storage:,}"  # type: ignore[attr-defined]

    def has_tenant_delete_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("tenants.delete_organization"))

    @admin.action(description="Delete tenant (everything, files included)", permissions=["tenant_delete"])
    def delete_tenants(self, request: HttpRequest, queryset: QuerySet[Organization]) -> HttpResponse | None:
        tenants = list(queryset.select_related("plan"))
        if request.POST.get("confirm") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Delete tenants",
                "tenants": with_usage(queryset.select_related("plan")),
                "selected": [str(t.pk) for t in tenants],
                "opts": self.model._meta,
            }
            return TemplateResponse(request, "admin/speech/delete_tenants.html", context)
        for org in tenants:
            try:
                counts = operator.delete_tenant(org)
            except DomainError as exc:
                self.message_user(
                    request, f"Tenant {org.name} was not deleted: {exc.message}", messages.ERROR
                )
                continue
            summary = ", ".join(f"{n} {name}(s)" for name, n in counts.items() if name != "organization")
            self.message_user(request, f"Deleted tenant {org.name}: {summary}.", messages.SUCCESS)
        return None


def plan_impact(plan: Plan, new_values: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's tenants, each with the new limits it would be over."""
    rows = []
    for org in with_usage(plan.organizations.all()).order_by("name"):
        over = [
            f"{field.replace('_', ' ')}: {getattr(org, usage):,} > {new_values[field]:,}"
            for field, usage in LIMIT_USAGE.items()
            if field in new_values and getattr(org, usage) > new_values[field]
        ]
        rows.append({"tenant": org, "over": over})
    return rows


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = (
        "name", "slug", "is_default", "tenants", "monthly_characters", "max_concurrent_jobs", "requests_per_minute"
    )  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[Plan]:
        return super().get_queryset(request).annotate(tenant_count=Count("organizations"))

    @admin.display(description="tenants", ordering="tenant_count")
    def tenants(self, plan: Plan) -> int:
        return int(plan.tenant_count)  # type: ignore[attr-defined]

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST" and object_id and "_confirmed" not in request.POST:
            preview = self._preview(request, object_id)
            if preview is not None:
                return preview
        return super().changeform_view(request, object_id, form_url, extra_context)

    def _preview(self, request: HttpRequest, object_id: str) -> HttpResponse | None:
        """Before a change is saved: what it does to the tenants on the plan. None: nothing to show."""
        plan = self.get_object(request, object_id)
        if plan is None or not self.has_change_permission(request, plan):
            return None
        form = self.get_form(request, plan, change=True)(request.POST, request.FILES, instance=plan)
        if not form.is_valid() or not form.has_changed():
            return None  # the normal view shows the errors, or saves nothing
        changes = [(name, form.initial.get(name), form.cleaned_data[name]) for name in form.changed_data]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Change plan {plan.name}: effect on its tenants",
            "plan": plan,
            "changes": changes,
            "impact": plan_impact(plan, {name: form.cleaned_data[name] for name in form.changed_data}),
            "post": [
                (k, v) for k in request.POST if k != "csrfmiddlewaretoken" for v in request.POST.getlist(k)
            ],
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/speech/plan_change_preview.html", context)
