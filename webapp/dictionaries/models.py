"""Pronunciation dictionaries: a tenant's named dictionaries, each a chain of immutable versions.

A version's rules never change once written (a change is a new version), so a
job that pins ``(dictionary, version)`` at submit speaks the same rules however
the dictionary moves on, and old versions stay readable and usable. Rules are
applied by synth.lexicon in the worker.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from webapp.tenants.models import Organization


class Alphabet(models.TextChoices):
    ARPABET = "arpabet"
    PINYIN = "pinyin"
    IPA = "ipa"


class Dictionary(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="dictionaries")
    name = models.CharField(max_length=100)
    description = models.CharField(max_length=500, blank=True)
    # The tenant's default: applied to every request that names no dictionaries (and on /v1/audio/speech).
    is_default = models.BooleanField(default=False)
    latest_version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="dictionary_name_per_tenant"),
            models.UniqueConstraint(
                fields=["organization"],
                condition=models.Q(is_default=True),
                name="one_default_dictionary_per_tenant",
            ),
        ]

    def __str__(self) -> str:
        return f"dictionary {self.name}"


class DictionaryVersion(models.Model):
    dictionary = models.ForeignKey(Dictionary, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    language = models.CharField(max_length=35, blank=True)  # PLS xml:lang, informative
    rule_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["dictionary", "number"], name="one_version_number"),
        ]

    def __str__(self) -> str:
        return f"{self.dictionary_id} v{self.number}"


class Rule(models.Model):
    version = models.ForeignKey(DictionaryVersion, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField()  # order in the version: the first rule for a word wins
    grapheme = models.CharField(max_length=100)
    case_sensitive = models.BooleanField(default=False)
    # An alias rule has no alphabet; a phoneme rule has one, and no alias.
    alias = models.CharField(max_length=200, blank=True)
    phonemes = models.CharField(max_length=200, blank=True)
    alphabet = models.CharField(max_length=10, choices=Alphabet.choices, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["version", "position"], name="one_rule_position"),
            models.CheckConstraint(
                condition=(models.Q(alphabet="", phonemes="") & ~models.Q(alias=""))
                | (models.Q(alias="") & ~models.Q(alphabet="") & ~models.Q(phonemes="")),
                name="rule_alias_or_phonemes",
            ),
        ]

    def __str__(self) -> str:
        return self.grapheme
