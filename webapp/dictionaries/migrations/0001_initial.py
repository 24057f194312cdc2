"""Pronunciation dictionaries, their immutable versions and rules (issue 34)."""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dictionary",
            fields=[
                (
                    "id",
                    models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False),
                ),
                ("name", models.CharField(max_length=100)),
                ("description", models.CharField(blank=True, max_length=500)),
                ("is_default", models.BooleanField(default=False)),
                ("latest_version", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "organization",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dictionaries",
                        to="tenants.organization",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="DictionaryVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveIntegerField()),
                ("language", models.CharField(blank=True, max_length=35)),
                ("rule_count", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "dictionary",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="versions",
                        to="dictionaries.dictionary",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="Rule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("position", models.PositiveIntegerField()),
                ("grapheme", models.CharField(max_length=100)),
                ("case_sensitive", models.BooleanField(default=False)),
                ("alias", models.CharField(blank=True, max_length=200)),
                ("phonemes", models.CharField(blank=True, max_length=200)),
                (
                    "alphabet",
                    models.CharField(
                        blank=True,
                        choices=[("arpabet", "Arpabet"), ("pinyin", "Pinyin"), ("ipa", "Ipa")],
                        max_length=10,
                    ),
                ),
                (
                    "version",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="rules",
                        to="dictionaries.dictionaryversion",
                    ),
                ),
            ],
            options={
                "ordering": ["position"],
            },
        ),
        migrations.AddConstraint(
            model_name="dictionary",
            constraint=models.UniqueConstraint(
                fields=("organization", "name"), name="dictionary_name_per_tenant"
            ),
        ),
        migrations.AddConstraint(
            model_name="dictionary",
            constraint=models.UniqueConstraint(
                condition=models.Q(("is_default", True)),
                fields=("organization",),
                name="one_default_dictionary_per_tenant",
            ),
        ),
        migrations.AddConstraint(
            model_name="dictionaryversion",
            constraint=models.UniqueConstraint(fields=("dictionary", "number"), name="one_version_number"),
        ),
        migrations.AddConstraint(
            model_name="rule",
            constraint=models.UniqueConstraint(fields=("version", "position"), name="one_rule_position"),
        ),
        migrations.AddConstraint(
            model_name="rule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("alphabet", ""), ("phonemes", ""), models.Q(("alias", ""), _negated=True)),
                    models.Q(
                        ("alias", ""),
                        models.Q(("alphabet", ""), _negated=True),
                        models.Q(("phonemes", ""), _negated=True),
                    ),
                    _connector="OR",
                ),
                name="rule_alias_or_phonemes",
            ),
        ),
    ]
