"""Members, users and API keys in the admin. Tenants and plans are in ``webapp.console.tenants``.

An API key shows its prefix, name, scopes and last use; its hash is never
shown, and a secret is never typed in here (keys are issued through the API,
the dashboard or ``manage.py``). Revoking goes through the key service, which
records it in the audit log.
"""

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from webapp.tenants.models import ApiKey, Membership
from webapp.tenants.services import OPERATOR, revoke_api_key


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "organization", "role", "created_at")
    list_filter = ("role",)
    list_select_related = ("user", "organization")
    search_fields = ("user__username", "user__email", "organization__name", "organization__slug")
    raw_id_fields = ("user", "organization")


class MembershipInline(admin.TabularInline):
    model = Membership
    fk_name = "user"
    extra = 0
    raw_id_fields = ("organization",)
    fields = ("organization", "role", "created_at")
    readonly_fields = ("created_at",)


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class UserWithMembershipsAdmin(UserAdmin):
    """Django's user admin, with the tenants each user belongs to."""

    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "prefix",
        "organization",
        "user",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "organization__name")
    exclude = ("secret_hash",)  # never shown, not even read-only
    readonly_fields = (
        "organization",
        "prefix",
        "scopes",
        "user",
        "created_by",
        "parent",  # set once, by the key service: its bounds and revocation follow it
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
