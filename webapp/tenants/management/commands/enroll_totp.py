"""Give a staff user a TOTP device for the admin's second factor and show it once.

    manage.py enroll_totp alice            # prints the otpauth:// URI and a QR code
    manage.py enroll_totp alice --replace  # a lost phone: the old device stops working

Scan the QR code (or paste the URI) into an authenticator app; the admin login
then asks for its six-digit code whenever TTS_ADMIN_REQUIRE_OTP is on.
"""

from __future__ import annotations

import io
from typing import Any

import segno
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice

DEVICE_NAME = "admin"


class Command(BaseCommand):
    help = "Create a TOTP device for a staff user (the admin's second factor) and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--replace", action="store_true", help="Delete the user's existing TOTP devices first."
        )
        parser.add_argument("--no-qr", action="store_true", help="Print the URI only.")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        if not user.is_staff:
            raise CommandError(f"{user} is not staff; the admin's second factor is for staff.")
        existing = TOTPDevice.objects.filter(user=user)
        if existing.exists() and not options["replace"]:
            raise CommandError(f"{user} has a TOTP device; pass --replace to issue a new one.")
        existing.delete()
        device = TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=True)
        self.stdout.write(f"TOTP device for {user} (shown once):\n  {device.config_url}\n")
        if not options["no_qr"]:
            qr = io.StringIO()
            segno.make(device.config_url).terminal(out=qr, compact=True)
            self.stdout.write(qr.getvalue())
