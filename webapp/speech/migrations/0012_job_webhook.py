"""A submit's own webhook URL (issue 34)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0011_pinned_dictionaries"),
    ]

    operations = [
        migrations.AddField(
            model_name="synthesisjob",
            name="webhook_url",
            field=models.URLField(blank=True, default="", max_length=2000),
        ),
    ]
