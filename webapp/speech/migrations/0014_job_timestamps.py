"""Word and sentence timestamps of a job's audio, in a table of their own (issue 33)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0013_usage_dimensions"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobTimestamps",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="speech.synthesisjob",
                    ),
                ),
                ("words", models.JSONField(default=list)),
                ("sentences", models.JSONField(default=list)),
            ],
        ),
    ]
