"""``manage.py export_tenant <slug-or-id> [--out FILE]``: a tenant's data as one JSON document.

The same document as ``GET /api/v1/organization/export`` (``webapp.speech.services.tenant_export``),
recorded in the audit log as the operator's. With ``--out`` it is written whole or not at all (a
temporary file beside it, fsynced, then renamed over it), readable by its owner only: it holds
members' addresses and the consents' audit records. Without, it goes to standard output.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.speech.services import tenant_export
from webapp.tenants.models import Organization
from webapp.tenants.services import OPERATOR


def find_tenant(ref: str) -> Organization:
    """The organization by its slug, else by its id."""
    org = Organization.objects.select_related("plan").filter(slug=ref).first()
    if org is None:
        with contextlib.suppress(ValueError):
            org = Organization.objects.select_related("plan").filter(pk=uuid.UUID(ref)).first()
    if org is None:
        raise CommandError(f"No organization with the slug or id {ref!r}.")
    return org


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path``, whole or not at all, mode 0600."""
    directory = path.resolve().parent
    if not directory.is_dir():
        raise CommandError(f"{directory} is not a directory.")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Command(BaseCommand):
    help = (
        "Export a tenant's data (organization, members, keys, voices, consents, dictionaries, jobs) as JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the organization's slug or id")
        parser.add_argument("--out", type=Path, help="the file to write (default: standard output)")

    def handle(self, *args: Any, **options: Any) -> None:
        org = find_tenant(str(options["tenant"]))
        document = tenant_export.export_tenant(org, OPERATOR)
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        out: Path | None = options["out"]
        if out is None:
            self.stdout.write(text, ending="")
            return
        write_atomically(out, text)
        counts = ", ".join(f"{len(document[k])} {k}" for k in ("voices", "voice_consents", "jobs"))
        self.stderr.write(f"{org.slug}: written to {out} ({counts})")
