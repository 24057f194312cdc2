from django.contrib import admin

from webapp.tenants.models import ApiKey, Membership, Organization, Plan


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


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "organization", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "secret_hash", "last_used_at")
