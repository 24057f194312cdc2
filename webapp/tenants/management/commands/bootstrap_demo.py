"""Create the admin user and a demo tenant with one API key, once.

Credentials are printed only when they are created; running again changes
nothing and prints nothing secret.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from webapp.tenants.models import Organization
from webapp.tenants.services import create_api_key, create_organization


class Command(BaseCommand):
    help = "Create the admin user and the demo tenant with an API key (first run only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--https-port", type=int, default=8443)

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if Organization.objects.filter(slug="demo").exists():
            self.stdout.write("Demo tenant exists; credentials were printed on the first run.")
            return
        password = secrets.token_urlsafe(12)
        admin = User.objects.filter(username="admin").first()
        if admin is None:
            admin = User.objects.create_superuser("admin", "admin@localhost", password)
        org = create_organization("Demo", owner=admin, slug="demo")
        _, raw_key = create_api_key(org, "demo key", created_by=admin)
        port = options["https_port"]
        self.stdout.write(
            "\n"
            "  ================================================================\n"
            "  Created once; these are not shown again:\n"
            f"    admin console  https://localhost:{port}/admin/\n"
            f"    user           admin\n"
            f"    password       {password}\n"
            f"    API key        {raw_key}\n"
            "  ================================================================\n"
        )
