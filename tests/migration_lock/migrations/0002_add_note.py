from django.db import migrations


class Migration(migrations.Migration):
    # ALTER TABLE: ACCESS EXCLUSIVE, which waits behind any transaction that read the table.
    dependencies = [("migration_lock", "0001_initial")]
    operations = [
        migrations.RunSQL(
            "ALTER TABLE migration_lock_probe ADD COLUMN note text",
            "ALTER TABLE migration_lock_probe DROP COLUMN note",
        )
    ]
