"""What the dashboard keeps about a person beyond Django's user."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Account(models.Model):
    """Created by open sign-up: until the e-mail is verified, no key and no synthesis.

    People without a row (the operator, the demo user, invited members, who
    prove their address by following the set-password link) are not held back.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="dashboard")
    email_verified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"account of {self.user}"
