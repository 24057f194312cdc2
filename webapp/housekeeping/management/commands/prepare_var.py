"""Create the folders and secret files the service needs: ``manage.py prepare_var``.

Importing the settings creates nothing (webapp/provisioning.py): run this before the
service's processes start, as the user they run as. The systemd units run it first
(``ExecStartPre``); the local and test stacks and a restore run the same function
through deploy/provision.py. It creates the log, media, static, run, run/jobs, voices,
tmp and cache folders and each secret file (mode 0600, in a 0700 folder) whose variable
(``DJANGO_SECRET_KEY``, ``TTS_API_KEY_SECRET``) is not set; what exists is kept.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp.provisioning import prepare_var


class Command(BaseCommand):
    help = "Create the folders and secret files the service needs under TTS_VAR_DIR (existing ones are kept)."
    # A provisioning step: it runs before anything else, on a var/ that may not exist yet.
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        layout = settings.TTS_VAR_LAYOUT
        created = prepare_var(layout)
        for path in created:
            self.stdout.write(f"created {path}")
        if not created:
            self.stdout.write(f"nothing to create under {layout.var_dir}: every folder and secret is there")
