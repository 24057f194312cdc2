"""``manage.py models``: the model directories under TTS_MODELS_DIR; ``models verify NAME`` checks one.

Listing reads each directory's config and its verification record (synth.models); verifying
reads the weights' headers, compares them with the engine's model built from the config on
torch's meta device, says exactly what is missing or wrong (exit 1), and records the
checksum a worker then runs it with (exit 0). Run it on a worker host: it needs the engine's
package, as the worker does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from synth import models


class Command(BaseCommand):
    help = "List the model directories under TTS_MODELS_DIR, or verify one: models verify NAME."
    requires_system_checks: list[str] = []  # reads files only: no database needed

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=["list", "verify"], default="list")
        parser.add_argument("name", nargs="?", help="the model directory to verify")

    def handle(self, *args: Any, **options: Any) -> None:
        root = Path(settings.TTS_MODELS_DIR)
        if options["action"] == "verify":
            if not options["name"]:
                raise CommandError("name the model directory to verify: manage.py models verify NAME")
            self._verify(root, str(options["name"]))
            return
        dirs = models.model_dirs(root)
        if not dirs:
            self.stdout.write(f"no model directories under {root} (TTS_MODELS_DIR)")
        for directory in dirs:
            try:
                engine = models.engine_of(directory)
            except models.ModelError as exc:
                self.stdout.write(f"{directory.name}\tbroken: {exc}")
                continue
            record = models.recorded(directory)
            state = f"verified {record['checksum']}" if record else "not verified (or changed since)"
            self.stdout.write(f"{directory.name}\tengine {engine}\t{state}")

    def _verify(self, root: Path, name: str) -> None:
        try:
            report = models.verify(root, name)
        except models.ModelError as exc:
            raise CommandError(f"{name}: {exc}") from exc
        if not report.ok:
            for line in report.lines():
                self.stderr.write(f"{name}: {line}")
            raise CommandError(
                f"{name}: {len(report.lines())} problem(s); the model was not recorded as verified"
            )
        self.stdout.write(f"{name}: ok, {report.checksum} recorded")
