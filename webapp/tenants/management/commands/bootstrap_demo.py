"""Create the admin user and a demo tenant with one API key, once.

Credentials are printed only when they are created; running again changes
nothing and prints nothing secret.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp.tenants.models import ApiKey, Organization
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
        # The demo key may do everything, key management included, to try the whole API.
        _, raw_key = create_api_key(org, "demo key", created_by=admin, scopes=ApiKey.ALL_SCOPES)
        totp = ""
        if settings.TTS_ADMIN_REQUIRE_OTP and not TOTPDevice.objects.filter(user=admin).exists():
            device = TOTPDevice.objects.create(user=admin, name="admin", confirmed=True)
            totp = f"    TOTP (admin)   {device.config_url}\n"
        port = options["https_port"]
        self.stdout.write(
            "\n"
            "  ================================================================\n"
            "  Created once; these are not shown again:\n"
            f"    dashboard      https://localhost:{port}/\n"
            f"    admin console  https://localhost:{port}/admin/\n"
            f"    user           admin\n"
            f"    password       {password}\n"
            f"    API key        {raw_key}\n"
            f"{totp}"
            "  ================================================================\n"
        )
