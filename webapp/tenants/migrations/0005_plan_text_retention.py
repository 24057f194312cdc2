from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_plan_max_concurrent_waits"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="text_retention_days",
            field=models.PositiveIntegerField(blank=True, default=30, null=True),
        ),
    ]
