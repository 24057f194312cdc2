import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_invitation"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="children",
                to="tenants.apikey",
            ),
        ),
    ]
