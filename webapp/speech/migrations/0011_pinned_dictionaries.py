"""The dictionaries a job pins at submit (issue 34)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dictionaries", "0001_initial"),
        ("speech", "0010_sentence_cache"),
    ]

    operations = [
        migrations.AddField(
            model_name="synthesisjob",
            name="dictionaries",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name="synthesisjob",
            name="pinned_dictionary_versions",
            field=models.ManyToManyField(
                blank=True, related_name="pinning_jobs", to="dictionaries.dictionaryversion"
            ),
        ),
    ]
