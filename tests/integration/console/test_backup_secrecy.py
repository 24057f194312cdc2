"""make backup / make restore keep what they must and nothing else: archives encrypted to a key the
operator holds outside var/ (a clear one only when asked for), rotated after the new one is whole,
without live sessions, and without the files of deleted tenants and voices.

Each test runs ``deploy.backup.main``, what ``make backup`` / ``make restore`` run, with the
settings in the environment as an operator sets them.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from deploy import backup, provision
from deploy.provision import StackConfig
from tests.integration.api.conftest import wait_finished
from tests.integration.console.conftest import Make
from tests.stack import spare_port


@pytest.fixture
def fresh_cfg(stack: Any) -> StackConfig:
    var_dir = Path(stack.cfg.var_dir, "restored-secrecy")
    shutil.rmtree(var_dir, ignore_errors=True)
    return StackConfig(
        var_dir=var_dir, pg_port=spare_port(), redis_port=0, http_port=0, https_port=0, name="restore"
    )


def _archives(folder: Path) -> list[Path]:
    return sorted(folder.glob("tts-backup-*"))


def _finished_job(tenant: Any, text: str) -> str:
    from webapp.speech.models import SynthesisJob

    job = tenant.client.post("/api/v1/speech", {"text": text}).json()["id"]
    assert wait_finished(tenant.client, job)["status"] == "succeeded"
    return str(SynthesisJob.objects.get(id=job).audio_path)


def test_make_backup_encrypts_to_the_operators_key_and_restore_needs_the_identity(
    live_tenant: Any,
    stack: Any,
    backups: Path,
    make: Make,
    operator_key: tuple[Path, str],
    fresh_cfg: StackConfig,
    tmp_path: Path,
) -> None:
    from django.contrib.sessions.backends.db import SessionStore

    identity, recipient = operator_key
    tenant = live_tenant()
    audio = _finished_job(tenant, "Encrypted in the backup.")
    session = SessionStore()
    session["signed_in"] = True
    session.create()  # committed: a live session the dump would carry

    rc, said = make(["backup"], stack.cfg, TTS_BACKUP_RECIPIENTS=recipient)
    assert rc == 0, said
    [archive] = _archives(backups)
    assert archive.name.endswith(".tar.gz.age") and archive.stat().st_mode & 0o077 == 0
    assert archive.read_bytes().startswith(b"age-encryption.org/v1\n")
    with pytest.raises(tarfile.ReadError):
        tarfile.open(archive)
    secret = stack.cfg.path("secrets", "api_key_secret").read_bytes().strip()

    rc, said = make(["restore", str(archive)], fresh_cfg)
    assert rc == 1 and "is encrypted" in said and "IDENTITY=" in said
    assert not fresh_cfg.var_dir.exists(), "a refused restore wrote something"
    stranger = tmp_path / "stranger.key"
    subprocess.run(["age-keygen", "-o", str(stranger)], check=True, capture_output=True)
    rc, said = make(["restore", str(archive), "--identity", str(stranger)], fresh_cfg)
    assert rc == 1 and "cannot decrypt" in said
    assert not provision.pg_initialised(fresh_cfg) and not any(fresh_cfg.var_dir.iterdir())

    rc, said = make(["restore", str(archive), "--identity", str(identity)], fresh_cfg)
    assert rc == 0, said
    assert not list(fresh_cfg.var_dir.glob(".decrypted-*")), "the clear archive was left in var/"
    assert fresh_cfg.path("secrets", "api_key_secret").read_bytes().strip() == secret
    assert fresh_cfg.path("media", audio).read_bytes() == Path(settings.MEDIA_ROOT, audio).read_bytes()
    with backup.postgres_running(fresh_cfg), psycopg.connect(fresh_cfg.database_url) as db:
        key = db.execute("SELECT secret_hash FROM tenants_apikey WHERE prefix = %s", [tenant.key.prefix])
        assert key.fetchone() == (tenant.key.secret_hash,)
        sessions = db.execute("SELECT count(*) FROM django_session").fetchone()
    assert sessions == (0,), "live sessions were restored: whoever holds the archive could use them"


def test_without_a_recipient_make_backup_refuses_unless_a_clear_archive_is_asked_for(
    db: None, stack: Any, backups: Path, make: Make
) -> None:
    rc, said = make(["backup"], stack.cfg)
    assert rc == 1
    assert "TTS_BACKUP_RECIPIENTS" in said and "make backup CLEAR=1" in said and "age-keygen" in said
    left = [p for p in backups.iterdir() if p.name.startswith(("tts-backup-", ".tts-backup-", ".backup-"))]
    assert not left, "a refused backup left something"

    rc, said = make(["backup", "--clear"], stack.cfg)
    assert rc == 0, said
    assert "not encrypted" in said
    [archive] = _archives(backups)
    assert archive.name.endswith(".tar.gz") and archive.stat().st_mode & 0o077 == 0
    with tarfile.open(archive) as opened:
        assert "secrets/api_key_secret" in opened.getnames()


def test_make_backup_keeps_the_newest_archives_once_the_new_one_is_whole(
    db: None, stack: Any, backups: Path, make: Make, operator_key: tuple[Path, str]
) -> None:
    older = [backups / f"tts-backup-2026010{day}-030000.tar.gz.age" for day in (1, 2, 3)]
    for path in older:
        path.write_bytes(b"age-encryption.org/v1\n(an older archive)")
    unrelated = backups / "notes.txt"
    unrelated.write_text("the operator's own file")

    rc, said = make(["backup"], stack.cfg, TTS_BACKUP_RECIPIENTS="age1notakey", TTS_BACKUP_KEEP="2")
    assert rc == 1 and "age refuses the backup recipients" in said
    assert _archives(backups) == older, "a failed backup deleted archives"

    rc, said = make(["backup"], stack.cfg, TTS_BACKUP_RECIPIENTS=operator_key[1], TTS_BACKUP_KEEP="2")
    assert rc == 0, said
    kept = _archives(backups)
    assert len(kept) == 2 and kept[0] == older[2], kept
    assert kept[1].name > older[2].name and backup.is_encrypted(kept[1])
    assert unrelated.exists()


def test_a_backup_leaves_out_the_files_of_deleted_tenants_and_voices(
    live_tenant: Any, stack: Any, backups: Path, make: Make
) -> None:
    from webapp.speech.models import Voice
    from webapp.speech.operator import delete_tenant

    media = Path(settings.MEDIA_ROOT)

    def voice_with_prompt(org: Any) -> Voice:
        prompt = f"voices/{org.pk}/{uuid.uuid4().hex}.wav"
        Path(media, prompt).parent.mkdir(parents=True, exist_ok=True)
        Path(media, prompt).write_bytes(b"RIFF" + bytes(64))
        return Voice.objects.create(
            voice_id=f"zz-backup-{uuid.uuid4().hex[:8]}",
            organization=org,
            name="A voice",
            engine="piper",
            language="en",
            sample_rate=22050,
            prompt_path=prompt,
            prompt_bytes=68,
            cloning_mode="approximate",
        )

    kept, gone = live_tenant(), live_tenant()
    kept_audio = _finished_job(kept, "This tenant stays.")
    kept_voice = voice_with_prompt(kept.org)
    deleted_voice = voice_with_prompt(kept.org)
    gone_audio = _finished_job(gone, "This tenant is deleted.")
    gone_voice = voice_with_prompt(gone.org)
    leftovers = [gone_audio, gone_voice.prompt_path, deleted_voice.prompt_path]
    delete_tenant(gone.org)
    Voice.objects.filter(pk=deleted_voice.pk).delete()
    # What a removal that never ran leaves (the process died between the commit and the unlink):
    # the files are back where they were, their rows gone; and an orphan no row ever named.
    for relative in leftovers:
        Path(media, relative).parent.mkdir(parents=True, exist_ok=True)
        Path(media, relative).write_bytes(b"RIFF" + bytes(64))
    orphan = f"audio/{kept.org.pk}/{uuid.uuid4()}.1.wav"
    Path(media, orphan).write_bytes(b"RIFF")

    rc, said = make(["backup"], stack.cfg, TTS_BACKUP_ALLOW_CLEAR="1")  # clear: to read it here
    assert rc == 0, said
    [archive] = _archives(backups)
    with tarfile.open(archive) as opened:
        names = set(opened.getnames())
    assert {f"media/{kept_audio}", f"media/{kept_voice.prompt_path}"} <= names
    assert not {f"media/{p}" for p in [*leftovers, orphan]} & names, "deleted data is in the backup"
    assert not [n for n in names if str(gone.org.pk) in n], "the deleted tenant's folders are named"
