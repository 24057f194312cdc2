"""The plan's sentence cache settings and the tenant's cache bytes (issue 33)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0007_apikey_parent"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="sentence_cache_bytes",
            field=models.PositiveBigIntegerField(default=256 * 1024 * 1024),
        ),
        migrations.AddField(
            model_name="plan",
            name="cached_character_price",
            field=models.FloatField(
                default=1.0,
                validators=[
                    django.core.validators.MinValueValidator(0.0),
                    django.core.validators.MaxValueValidator(1.0),
                ],
            ),
        ),
        migrations.AddField(
            model_name="organization",
            name="sentence_cache_used",
            field=models.PositiveBigIntegerField(db_default=0, default=0),
        ),
    ]
