"""Tenants: the organisation, its members, its plan and its API keys."""

from __future__ import annotations

import datetime
import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Plan(models.Model):
    """The limits a tenant lives within. A default plan is created by a migration."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100)
    is_default = models.BooleanField(default=False)
    monthly_characters = models.PositiveBigIntegerField(default=100_000)
    max_characters_per_request = models.PositiveIntegerField(default=5_000)
    max_concurrent_jobs = models.PositiveIntegerField(default=4)
    requests_per_minute = models.PositiveIntegerField(default=60)
    max_voices = models.PositiveIntegerField(default=5)
    max_upload_bytes = models.PositiveBigIntegerField(default=10 * 1024 * 1024)
    # Every uploaded voice names a recorded consent (docs/voices.md, "Consent"); without it only
    # voices that are cloned need one, and others take the uploader's word (consent=true).
    voices_need_recorded_consent = models.BooleanField(default=False)
    retention_days = models.PositiveIntegerField(default=7)
    # Days after a job ends before its text is blanked (None: kept for ever). The row stays:
    # its key, voice, source and characters are the tenant's history and usage.
    text_retention_days = models.PositiveIntegerField(null=True, blank=True, default=30)
    storage_bytes = models.PositiveBigIntegerField(default=1024 * 1024 * 1024)
    # Long-polls and /v1/audio/speech requests waiting at once, across all web processes.
    max_concurrent_waits = models.PositiveIntegerField(default=20)
    # The dashboard asks this plan's owners for a TOTP second factor.
    owners_need_totp = models.BooleanField(default=False)
    # The sentence cache (issue 33, webapp/speech/services/sentence_cache.py): the bytes of rendered
    # sentences kept for the tenant (0: no cache), and what a character served from it costs
    # against a fresh one (1.0 full price ... 0.0 free).
    sentence_cache_bytes = models.PositiveBigIntegerField(default=256 * 1024 * 1024)
    cached_character_price = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    # Pronunciation dictionaries (webapp.dictionaries): how many, rules per version, bytes per PLS import.
    max_dictionaries = models.PositiveIntegerField(default=10)
    max_dictionary_rules = models.PositiveIntegerField(default=1000)
    # Versions kept per dictionary: a new one past it removes the oldest no unfinished job pins.
    max_dictionary_versions = models.PositiveIntegerField(default=50)
    max_dictionary_import_bytes = models.PositiveIntegerField(default=256 * 1024)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=models.Q(is_default=True), name="one_default_plan"
            )
        ]

    def __str__(self) -> str:
        return self.name


class Organization(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="organizations")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Bytes its sentence cache holds: added to as workers store sentences, set exact by housekeeping
    # (evict_sentence_cache); counted in its storage.
    sentence_cache_used = models.PositiveBigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="one_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class Invitation(models.Model):
    """An address asked to join with a role: a pending row, never an account.

    Nothing is created for the address until the person follows the mailed
    link (whose secret only the mail holds: the row keeps its HMAC) and either
    chooses a password or signs in to the account that already has it, so an
    invitation can neither squat an address nor tell the inviter whether it is
    registered. Accepting or withdrawing deletes the row; one per address and
    organisation (inviting again sends a new link and the old one stops working).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.CharField(max_length=150)  # lower-cased
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "email"], name="one_invitation_per_address")
        ]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.organization} ({self.role})"


# A key expiring within this many days is flagged (the keys API's expiring_soon, the keys page).
KEY_EXPIRY_WARNING_DAYS = 14


class ApiKey(models.Model):
    """A key looks like ``tts_<prefix>_<secret>``; only an HMAC of the secret is stored.

    A key acts for its ``user`` with that user's current role in the tenant
    (see ``webapp.tenants.roles``); a key without a user was issued by the
    operator for the tenant as a whole and acts with the admin role.
    """

    class Scope(models.TextChoices):
        SPEECH_WRITE = "speech:write"
        SPEECH_READ = "speech:read"
        VOICES_WRITE = "voices:write"
        KEYS_MANAGE = "keys:manage"

    ALL_SCOPES = [scope.value for scope in Scope]
    # What a new key gets when nobody asks for scopes: never key management.
    DEFAULT_SCOPES = [Scope.SPEECH_READ.value, Scope.SPEECH_WRITE.value]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=8, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    # The user the key acts for. Deleting the user deletes the key: a key never
    # outlives its holder and never falls back to the tenant-wide admin role.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys"
    )
    # Who issued it (None: the operator); kept for the record.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The key that created this one through the API (None: a person or the operator did).
    # A key never outlives, outranks or outscopes its parent, and revoking the parent
    # revokes it (services.revoke_api_key), so the per-request lookup never looks up the tree.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # A rate of its own, below the plan's (None: only the tenant's rate applies).
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # The client address of that use, written with it (at most once a minute).
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Characters a month the key's jobs may take, below the plan's (None: only the plan's binds);
    # a key created by this one gets no more (services.create_api_key).
    monthly_characters = models.PositiveBigIntegerField(null=True, blank=True)
    # Rotation: the secret before the last rotation keeps working until previous_valid_until.
    previous_secret_hash = models.CharField(max_length=64, blank=True, default="", db_default="")
    previous_valid_until = models.DateTimeField(null=True, blank=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} (tts_{self.prefix}_…)"

    def is_usable(self, now: datetime.datetime | None = None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now
