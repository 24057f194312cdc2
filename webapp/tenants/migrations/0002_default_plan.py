from django.db import migrations


def create_default_plan(apps, schema_editor):  # type: ignore[no-untyped-def]
    Plan = apps.get_model("tenants", "Plan")
    Plan.objects.get_or_create(slug="free", defaults={"name": "Free", "is_default": True})


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(create_default_plan, migrations.RunPython.noop)]
