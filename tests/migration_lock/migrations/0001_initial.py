from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.RunSQL(
            "CREATE TABLE migration_lock_probe (id integer PRIMARY KEY)",
            "DROP TABLE migration_lock_probe",
        )
    ]
