"""OperationsSnapshot.at is the minute, unique: one row a minute whatever runs snapshot_operations."""

import django.utils.timezone
from django.db import migrations, models

# Rows written before: keep the latest of each minute, then move each to its minute.
# date_trunc in the session's zone: every zone's offset is whole minutes, so the minute is the same.
ONE_PER_MINUTE = """
DELETE FROM housekeeping_operationssnapshot a
 USING housekeeping_operationssnapshot b
 WHERE date_trunc('minute', a.at) = date_trunc('minute', b.at) AND a.id < b.id;
UPDATE housekeeping_operationssnapshot SET at = date_trunc('minute', at);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("housekeeping", "0002_operations_snapshot"),
    ]

    operations = [
        migrations.RunSQL(ONE_PER_MINUTE, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="operationssnapshot",
            name="at",
            field=models.DateTimeField(default=django.utils.timezone.now, unique=True),
        ),
    ]
