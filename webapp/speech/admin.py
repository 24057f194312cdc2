from django.contrib import admin

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
