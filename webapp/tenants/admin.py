from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from webapp.tenants.models import ApiKey, Membership, Organization, Plan
from webapp.tenants.services import OPERATOR, revoke_api_key


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "slug",
        "is_default",
        "monthly_characters",
        "max_concurrent_jobs",
        "requests_per_minute",
    )


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "plan", "is_active", "created_at")
    search_fields = ("name", "slug")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "organization", "role")
    list_filter = ("role",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are issued through the API, the dashboard or ``manage.py``: a secret is never typed in here."""

    list_display = ("name", "prefix", "organization", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "organization__name")
    readonly_fields = (
        "organization",
        "prefix",
        "secret_hash",
        "user",
        "created_by",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        keys = list(queryset.filter(revoked_at__isnull=True).select_related("organization"))
        for key in keys:
            revoke_api_key(key, by=OPERATOR)
        self.message_user(request, f"Revoked {len(keys)} key(s).", messages.SUCCESS)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("organization", "user")
