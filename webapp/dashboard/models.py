"""What the dashboard keeps about a person beyond Django's user."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.utils import timezone
from django_otp.models import Device, ThrottlingMixin, TimestampMixin


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


# PBKDF2-SHA256 rounds for a new set of recovery codes (each set keeps its own count):
# a code is checked once per attempt (one digest, then an index lookup), and a copy of
# the database costs 2^40 x this many rounds per person to search offline.
RECOVERY_CODE_ITERATIONS = 50_000


def normalise_recovery_code(code: str) -> str:
    """What a person types, as it is digested: case, spaces and dashes do not matter."""
    return code.strip().lower().replace("-", "").replace(" ", "")


def recovery_code_digest(code: str, salt: str, iterations: int) -> str:
    return hashlib.pbkdf2_hmac(
        "sha256", normalise_recovery_code(code).encode(), salt.encode(), iterations
    ).hex()


class RecoveryCodes(ThrottlingMixin, TimestampMixin, Device):
    """A person's recovery codes, a second factor of django-otp: each one works once.

    Only a salted, slow digest of each code is kept (django-otp's static tokens
    keep them in clear): a copy of the database, a backup, holds no code anyone
    can type. Wrong codes slow the device down as django-otp's devices do.
    """

    salt = models.CharField(max_length=32)
    iterations = models.PositiveIntegerField(default=RECOVERY_CODE_ITERATIONS)

    class Meta:
        verbose_name = "recovery codes"
        verbose_name_plural = "recovery codes"

    def get_throttle_factor(self) -> int:
        return 1

    def verify_token(self, token: str) -> bool:
        allowed, _ = self.verify_is_allowed()
        if not allowed:
            return False
        match = self.codes.filter(digest=recovery_code_digest(token, self.salt, self.iterations)).first()
        if match is None:
            self.throttle_increment()
            return False
        match.delete()
        self.throttle_reset(commit=False)
        self.set_last_used_timestamp(commit=False)
        self.save()
        return True


class RecoveryCode(models.Model):
    """The digest of one unused recovery code."""

    device = models.ForeignKey(RecoveryCodes, on_delete=models.CASCADE, related_name="codes")
    digest = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "digest"], name="one_code_per_digest")]

    def __str__(self) -> str:
        return f"a recovery code of {self.device.user}"
