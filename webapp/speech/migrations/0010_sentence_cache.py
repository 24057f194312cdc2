"""The sentence cache's job fields (issue 33)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0009_job_engine_active_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="synthesisjob",
            name="cached_characters",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="use_cache",
            field=models.BooleanField(db_default=True, default=True),
        ),
    ]
