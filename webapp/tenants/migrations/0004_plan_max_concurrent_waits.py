from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0003_keys_roles_and_rates"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_concurrent_waits",
            field=models.PositiveIntegerField(default=20),
        ),
    ]
