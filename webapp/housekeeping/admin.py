from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from webapp.housekeeping.models import HousekeepingRun


@admin.register(HousekeepingRun)
class HousekeepingRunAdmin(admin.ModelAdmin):
    """Read-only: the rows are a record of what the scheduled jobs did."""

    list_display = ("job", "started_at", "duration_ms", "outcome", "counts")
    list_filter = ("job", "outcome")
    date_hierarchy = "started_at"
    ordering = ("-started_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
