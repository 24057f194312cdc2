from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import URLPattern, URLResolver, path, reverse

from webapp.speech import admin_views
from webapp.speech.models import SynthesisJob, UsageEvent, UsagePeriod, Voice


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = ("voice_id", "engine", "language", "organization", "status")
    search_fields = ("voice_id", "name")


@admin.register(SynthesisJob)
class SynthesisJobAdmin(admin.ModelAdmin):
    list_display = ("id", "organization", "status", "voice_name", "text_chars", "created_at")
    list_filter = ("status", "engine")
    readonly_fields = ("text", "metrics")


@admin.register(UsagePeriod)
class UsagePeriodAdmin(admin.ModelAdmin):
    list_display = ("organization", "period", "characters_used", "characters_reserved")


@admin.register(UsageEvent)
class UsageEventAdmin(admin.ModelAdmin):
    list_display = ("organization", "job_key", "kind", "characters", "period", "created_at")


# ----------------------------------------------------------------------------- the Workers page
# Not a model: a read-only view of the worker heartbeats in Redis. It is added to
# the default site's URLs and listed under the "Speech" app on the index and in
# the sidebar, for users who may view synthesis jobs (admin_views.can_view).

_site_get_urls = admin.site.get_urls
_site_get_app_list = admin.site.get_app_list


def _get_urls() -> list[URLPattern | URLResolver]:
    # Before the site's own patterns: its final catch-all would answer 404 otherwise.
    own = [path("speech/workers/", admin.site.admin_view(admin_views.workers_view), name="speech_workers")]
    return [*own, *_site_get_urls()]


def _get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
    app_list = _site_get_app_list(request, app_label)
    if not admin_views.can_view(request):
        return app_list
    for app in app_list:
        if app["app_label"] == "speech":
            app["models"].append(
                {
                    "name": "Workers",
                    "object_name": "Workers",
                    "perms": {"add": False, "change": False, "delete": False, "view": True},
                    "admin_url": reverse("admin:speech_workers", current_app=admin.site.name),
                    "add_url": None,
                    "view_only": True,
                }
            )
            app["models"].sort(key=lambda m: str(m["name"]))
    return app_list


admin.site.get_urls = _get_urls  # type: ignore[method-assign]
admin.site.get_app_list = _get_app_list  # type: ignore[method-assign]
