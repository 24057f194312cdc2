"""The audit log: who did what, when, to what, from which address."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEvent(models.Model):
    """One admin action, or one API key created or revoked anywhere.

    ``organization_id`` is a plain column, not a foreign key: the record of
    what happened to a tenant outlives the tenant (deleting one anonymises its
    events). Pruned by housekeeping after ``TTS_AUDIT_RETENTION_DAYS``.
    """

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept when the user goes: "alice", "api key tts_ab12cd34_…", "operator (manage.py)".
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=100, db_index=True)  # key.created, job.retried, admin.change, ...
    target_type = models.CharField(max_length=100, blank=True)  # tenants.apikey, speech.synthesisjob, ...
    target_id = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=300, blank=True)  # a readable name of the object
    organization_id = models.UUIDField(null=True, blank=True, db_index=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.target}"
