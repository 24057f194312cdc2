"""Backups cannot fill the disk they protect: the archive goes to the folder configured
(TTS_BACKUP_DIR, another disk than the media's and the database's if the operator wants), a backup
that would not fit is refused before anything is written, and one during which the disk fills
stops, leaves neither an archive nor a partial one, and leaves the service running.

The small disks are real: a tmpfs of a given size, mounted for the test (root only, as CI runs).
What fills one during a backup is another writer (``FILL``), as on a shared disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from tests.integration.api.conftest import wait_finished
from tests.integration.console.conftest import Make

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk (tmpfs) needs root")

MIB = 1024 * 1024
RESERVE = 8 * MIB  # TTS_BACKUP_MIN_FREE_BYTES in these tests (the default, 1 GiB, is more than a test disk)

# Another writer on the backup's disk: once the backup's partial archive holds a MiB, it takes all
# but `leave` bytes of what is free (one fallocate, at once) and writes down how big the partial was
# then: what the test asserts the filling overlapped.
FILL = r"""
import os, sys, time
disk, leave, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    for name in os.listdir(disk):
        if not (name.startswith(".tts-backup-") and name.endswith(".part")):
            continue
        try:
            size = os.path.getsize(os.path.join(disk, name))
        except FileNotFoundError:
            continue
        if size >= 1 << 20:
            stat = os.statvfs(disk)
            fd = os.open(os.path.join(disk, "filler"), os.O_CREAT | os.O_WRONLY, 0o600)
            os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize - leave)
            os.close(fd)
            with open(record, "w") as fh:
                fh.write(str(size))
            sys.exit(0)
    time.sleep(0.002)
sys.exit(1)
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Real filesystems of a given size in bytes (tmpfs), unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = tmp_path / f"disk-{len(mounted)}"
        point.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
            check=True,
            capture_output=True,
        )
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", str(point)], check=False)


def _committed_org() -> Any:
    from webapp.tenants.services import create_organization

    return create_organization(f"Backup space {uuid.uuid4().hex[:8]}")


def _voice_with_prompt(org: Any, size: int) -> str:
    """A voice row naming a prompt of ``size`` random (incompressible) bytes; returns its path."""
    from webapp.speech.models import Voice

    prompt = f"voices/{org.pk}/{uuid.uuid4().hex}.wav"
    Path(settings.MEDIA_ROOT, prompt).parent.mkdir(parents=True, exist_ok=True)
    Path(settings.MEDIA_ROOT, prompt).write_bytes(os.urandom(size))
    Voice.objects.create(
        voice_id=f"zz-space-{uuid.uuid4().hex[:8]}",
        organization=org,
        name="A large voice",
        engine="piper",
        language="en",
        sample_rate=22050,
        prompt_path=prompt,
        prompt_bytes=size,
        cloning_mode="approximate",
    )
    return prompt


def _database_bytes(stack: Any) -> int:
    with psycopg.connect(stack.cfg.database_url) as db:
        row = db.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


def _archives(folder: Path) -> list[Path]:
    return sorted(folder.glob("tts-backup-*"))


def test_it_refuses_a_backup_that_would_not_fit(
    transactional_db: None, stack: Any, backups: Path, make: Make, small_disk: Callable[[int], Path]
) -> None:
    org = _committed_org()
    for _ in range(2):
        _voice_with_prompt(org, 8 * MIB)
    # Room for the database and the reserve, not for the 16 MiB of media its rows name as well.
    disk = small_disk(_database_bytes(stack) + RESERVE + 8 * MIB)

    rc, said = make(
        ["backup", "--clear"], stack.cfg, TTS_BACKUP_DIR=str(disk), TTS_BACKUP_MIN_FREE_BYTES=str(RESERVE)
    )
    assert rc == 1, said
    assert "not enough free space for the backup" in said and str(disk) in said, said
    assert "TTS_BACKUP_DIR" in said and "TTS_BACKUP_MIN_FREE_BYTES" in said, said
    assert list(disk.iterdir()) == [], "a refused backup wrote something"
    assert _archives(backups) == [], "the archive went to var/backups, not where it was configured"


def test_the_archive_is_written_in_the_configured_folder_and_rotated_there(
    transactional_db: None, stack: Any, backups: Path, make: Make, small_disk: Callable[[int], Path]
) -> None:
    prompt = _voice_with_prompt(_committed_org(), MIB)
    disk = small_disk(_database_bytes(stack) + RESERVE + 32 * MIB)
    older = disk / "tts-backup-20260101-030000.tar.gz"
    older.write_bytes(b"(an older archive)")

    settings_ = {
        "TTS_BACKUP_DIR": str(disk),
        "TTS_BACKUP_MIN_FREE_BYTES": str(RESERVE),
        "TTS_BACKUP_KEEP": "1",
    }
    rc, said = make(["backup", "--clear"], stack.cfg, **settings_)
    assert rc == 0, said
    [archive] = _archives(disk)
    assert archive != older and archive.stat().st_mode & 0o077 == 0
    assert _archives(backups) == [], "an archive went to var/backups as well"
    assert not [p.name for p in disk.iterdir() if p.name.startswith(".")], "a temp file is left"
    with tarfile.open(archive) as opened:
        assert f"media/{prompt}" in opened.getnames()


def test_a_backup_folder_that_is_missing_is_refused_not_created(
    stack: Any, make: Make, tmp_path: Path
) -> None:
    """A folder on a disk that is not mounted: creating it would write the archive to the disk beneath."""
    unmounted = tmp_path / "mnt" / "backup-disk" / "tts"
    rc, said = make(["backup", "--clear"], stack.cfg, TTS_BACKUP_DIR=str(unmounted))
    assert rc == 1 and "TTS_BACKUP_DIR" in said and "does not exist" in said, said
    assert not unmounted.parent.exists()


@pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])
def test_a_disk_filling_during_a_backup_leaves_no_archive_and_the_service_running(
    live_tenant: Any,
    stack: Any,
    backups: Path,
    make: Make,
    small_disk: Callable[[int], Path],
    operator_key: tuple[Path, str],
    tmp_path: Path,
    encrypted: bool,
) -> None:
    tenant = live_tenant()
    for _ in range(3):
        _voice_with_prompt(tenant.org, 6 * MIB)
    disk = small_disk(_database_bytes(stack) + RESERVE + 48 * MIB)  # fits, with room to spare
    mode = {"TTS_BACKUP_RECIPIENTS": operator_key[1]} if encrypted else {"TTS_BACKUP_ALLOW_CLEAR": "1"}
    settings_ = {"TTS_BACKUP_DIR": str(disk), "TTS_BACKUP_MIN_FREE_BYTES": str(RESERVE), **mode}
    record = tmp_path / "filled-at"
    filler = subprocess.Popen([sys.executable, "-c", FILL, str(disk), str(RESERVE // 2), str(record)])
    try:
        rc, said = make(["backup"], stack.cfg, **settings_)
    finally:
        try:
            filled = filler.wait(timeout=5)
        except subprocess.TimeoutExpired:  # the backup ended and the filler is still waiting for it
            filler.kill()
            filled = filler.wait()
    assert filled == 0, "the partial archive never reached 1 MiB: nothing filled the disk"
    # The disk filled while the archive was being written: a MiB of it was on the disk then.
    assert int(record.read_text()) >= MIB
    assert rc == 1, said
    assert "filled up while writing the archive" in said and "TTS_BACKUP_MIN_FREE_BYTES" in said, said
    assert sorted(p.name for p in disk.iterdir()) == ["filler"], "an archive, partial or temp file is left"
    assert _archives(backups) == []

    # The service is untouched: PostgreSQL has no pg_dump session left, nor any lock of the backup's
    # (an exclusive lock is granted at once), and a job runs to its end.
    with psycopg.connect(stack.cfg.database_url) as db:
        dumps = db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump'")
        assert dumps.fetchone() == (0,)
        db.execute("SET lock_timeout = '1s'")
        db.execute("LOCK TABLE speech_voice, speech_synthesisjob IN ACCESS EXCLUSIVE MODE")
        db.rollback()
    job = tenant.client.post("/api/v1/speech", {"text": "Still speaking after a failed backup."}).json()
    assert wait_finished(tenant.client, job["id"])["status"] == "succeeded"

    # Once there is room again, the next backup goes through.
    (disk / "filler").unlink()
    rc, said = make(["backup"], stack.cfg, **settings_)
    assert rc == 0, said
    assert len(_archives(disk)) == 1
