"""The plan's dictionary limits (issue 34)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0008_plan_sentence_cache"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_dictionaries",
            field=models.PositiveIntegerField(default=10),
        ),
        migrations.AddField(
            model_name="plan",
            name="max_dictionary_rules",
            field=models.PositiveIntegerField(default=1000),
        ),
        migrations.AddField(
            model_name="plan",
            name="max_dictionary_import_bytes",
            field=models.PositiveIntegerField(default=256 * 1024),
        ),
    ]
