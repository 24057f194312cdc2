"""The speech models in the admin: voices editable (their files are not), jobs and the ledger read-only.

Jobs and ledger rows change only through the services (``webapp.speech.services``),
which keep the reservation, the charge and the files in step; the admin's own
save and delete would bypass them. Actions that change jobs (retry, cancel,
expire) belong to the admin console and call the services outside the admin's
transaction. Paths under MEDIA_ROOT are never typed in a form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from webapp.admin_site import View, site
from webapp.console import jobs, tenants  # noqa: F401 (tenants registers)
from webapp.console.operations import operations_data, operations_view, recycle_workers
from webapp.console.workers import can_view, workers_view
from webapp.speech.models import RetiredUsage, SynthesisJob, UsageEvent, UsagePeriod, Voice
from webapp.speech.services.prompts import unused_voices


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewing only: no add, change or delete (a view permission still shows the rows)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class UnusedVoiceFilter(admin.SimpleListFilter):
    """Tenant voices unused for TTS_VOICE_RETENTION_DAYS: reported for the operator, never deleted here."""

    title = "use"
    parameter_name = "unused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Unused past the retention period")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset & unused_voices() if self.value() == "yes" else queryset


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = (
        "voice_id", "engine", "language", "organization", "status", "cloning_mode", "pitch_median_hz", "last_used_at"
    )  # fmt: skip
    list_filter = ("status", "cloning_mode", UnusedVoiceFilter)
    list_select_related = ("organization",)
    search_fields = ("voice_id", "name")
    # Stored paths (prompt_path, original_path, ...) point into MEDIA_ROOT: never typed in a form;
    # the analysis (embedding, pitch, closest voice) and the consent record are facts, not settings.
    readonly_fields = (
        *(f.name for f in Voice._meta.fields if f.name.endswith("_path")),
        "prompt_bytes", "embedding", "pitch_median_hz", "pitch_low_hz", "pitch_high_hz", "closest_voice",
        "closest_similarity", "pitch_shift", "consent_by", "consent_by_label", "consent_at", "rejected_code",
        "prompt_stats", "last_used_at",
    )  # fmt: skip


@admin.register(SynthesisJob)
class SynthesisJobAdmin(jobs.JobActionsMixin, ReadOnlyAdmin):
    list_display = (
        "id", "organization", "status", "engine", "device", "voice_name", "text_chars", "created_at"
    )  # fmt: skip
    list_filter = (
        "status", "engine", jobs.DeviceFilter, ("created_at", admin.DateFieldListFilter), "organization"
    )  # fmt: skip
    list_select_related = ("organization",)
    search_fields = ("=id", "text")
    actions = ["retry", "cancel", "expire_now"]
    show_full_result_count = False  # one COUNT(*) fewer on a big table


@admin.register(UsagePeriod)
class UsagePeriodAdmin(ReadOnlyAdmin):
    list_display = ("organization", "period", "characters_used", "characters_reserved")
    list_select_related = ("organization",)


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyAdmin):
    list_display = ("organization", "job_key", "kind", "characters", "period", "created_at")
    list_select_related = ("organization",)


@admin.register(RetiredUsage)
class RetiredUsageAdmin(ReadOnlyAdmin):
    """The ledger's totals of deleted tenants, per month and plan (webapp.speech.operator)."""

    list_display = ("period", "plan", "tenants", "characters_used", "jobs")
    list_filter = ("plan",)


def _hidden(request: HttpRequest) -> bool:
    return False


# Not models, listed under "Speech" for users who may view synthesis jobs (can_view):
# a read-only view of the worker heartbeats in Redis, and the live Operations page
# with its JSON refresh and the Recycle workers action, which are served but not listed.
_PAGES: tuple[tuple[str, View, str, str, Callable[[HttpRequest], bool]], ...] = (
    ("speech/workers/", workers_view, "speech_workers", "Workers", can_view),
    ("speech/operations/", operations_view, "speech_operations", "Operations", can_view),
    ("speech/operations/data.json", operations_data, "speech_operations_data", "Operations data", _hidden),
    ("speech/operations/recycle/", recycle_workers, "speech_operations_recycle", "Recycle workers", _hidden),
)
for _route, _view, _name, _title, _visible in _PAGES:
    site.add_page("speech", _route, _view, name=_name, title=_title, visible=_visible)
