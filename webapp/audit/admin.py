"""The audit log in the admin: searchable, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from webapp.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("at", "actor_label", "action", "target", "ip", "request_id")
    list_filter = ("action", ("at", admin.DateFieldListFilter))
    search_fields = ("actor_label", "action", "target", "target_id", "ip", "request_id")
    date_hierarchy = "at"
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # pruned by housekeeping (prune_records), never by hand
