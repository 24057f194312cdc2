"""Count the usage reports' rows again from the ledger: ``manage.py recount_usage [--tenant SLUG]``.

Run it once after upgrading to the version that keeps usage per day and per key's month (the
reservations old workers made while the upgrade rolled are not in them), and after restoring
the ledger's events alone. Each tenant is counted under its own lock, one after another.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.speech import operator
from webapp.tenants.models import Organization


class Command(BaseCommand):
    help = "Count every tenant's (or one tenant's) usage per day and per key again from its ledger."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="the tenant's slug (default: every tenant)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenants = Organization.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"no tenant {options['tenant']!r}")
        for org in tenants.iterator():
            days, keys = operator.recount_usage(org)
            self.stdout.write(f"{org.slug}: {days} day rows, {keys} key rows")
