"""Backup and restore of a stack: the PostgreSQL database, the media folder and the key secrets.

``make backup`` (``python -m deploy.backup backup``) writes one archive,
``var/backups/tts-backup-<UTC time>.tar.gz.age`` (mode 0600), encrypted with
age to the operator's public key(s) (``TTS_BACKUP_RECIPIENTS``,
``TTS_BACKUP_RECIPIENTS_FILE``): the key that opens it is held outside
``var/``. Without a recipient it refuses, unless a clear ``.tar.gz`` is asked
for (``make backup CLEAR=1``). Then all but the ``TTS_BACKUP_KEEP`` newest
archives of the folder are deleted. The archive holds:

- ``database.dump``: ``pg_dump --format=custom``, one consistent snapshot of
  the database (pg_dump reads in a single repeatable-read transaction, so the
  stack may keep running), without the rows of live sessions (credentials: a
  restored stack asks everyone to sign in again);
- ``media/``: the files the dumped rows name (job audio, voice prompts, read
  in the dump's own snapshot), copied after the dump: a file the dump names
  is there unless retention removed it meanwhile. Nothing else of the media
  folder is: not the files of tenants, voices or jobs that were deleted (a
  removal that never ran leaves them until the orphan sweep), orphans, temp
  files (``.<name>.<hex>.part`` and the like) or links; a file that vanishes
  while the folder is walked is skipped: the stack keeps running while it is
  backed up;
- ``secrets/``: the API key HMAC secret and Django's secret key: without the
  first, no restored API key would ever verify. Keep the archive private.

``make restore FILE=... IDENTITY=...`` (``python -m deploy.backup restore FILE
--identity KEY``) decrypts an archive with the operator's age identity and brings
it back into a *fresh* ``var/`` (it refuses one that holds a
database or media): secrets first, then a new PostgreSQL cluster (with a new
password of its own) into which the dump is restored, then the media.
``make run`` then starts on the restored data (migrations newer than the
backup are applied as usual).

The archive is written to a hidden ``.<name>.part`` next to it, flushed to
disk and renamed into place: a backup that fails leaves no archive, nor any
partial one. The archive is produced by one writer (:func:`_write_archive`),
so another layer (compression, encryption) wraps that one stream.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import BinaryIO

import psycopg
from psycopg import sql

from deploy import provision
from deploy.provision import StackConfig, StackError
from webapp.env import env_bool, env_int, env_list, env_str, write_private
from webapp.provisioning import is_temp_name

SECRETS = ("api_key_secret", "django_secret_key")
FORMAT_VERSION = 1

# The columns whose rows name files of the media folder (paths relative to it):
# a backup carries those files and no others. Django's names, which deploy/
# cannot import (tests/unit/test_backup_media.py checks them against the models).
MEDIA_COLUMNS = {"speech_synthesisjob": ("audio_path",), "speech_voice": ("prompt_path", "original_path")}
# Tables whose rows are credentials that a restore need not bring back.
LEFT_OUT_TABLE_DATA = ("django_session",)
# What rotation counts as one of its archives (and nothing else in the folder).
ARCHIVE_NAME = re.compile(r"^tts-backup-(\d{8}-\d{6})\.tar\.gz(\.age)?$")
AGE_HEADERS = (b"age-encryption.org/v1\n", b"-----BEGIN AGE ENCRYPTED FILE-----")
NO_RECIPIENT = (
    "no recipient to encrypt the backup to, and a clear archive holds every secret of the stack. "
    "Make a key pair outside var/ (`age-keygen -o ~/tts-backup.key`; keep that file off this machine too) "
    "and set TTS_BACKUP_RECIPIENTS to its public key (`age-keygen -y ~/tts-backup.key`), or "
    "TTS_BACKUP_RECIPIENTS_FILE to a file of public keys; or ask for a clear archive: `make backup CLEAR=1`"
)


@dataclasses.dataclass(frozen=True)
class BackupPolicy:
    """How archives are written: encrypted to whom (or clear, when asked for), and how many are kept."""

    recipients: tuple[str, ...] = ()
    recipients_file: Path | None = None
    allow_clear: bool = False
    keep: int = 7

    @classmethod
    def from_env(cls) -> BackupPolicy:
        recipients_file = env_str("TTS_BACKUP_RECIPIENTS_FILE", "")
        return cls(
            recipients=tuple(env_list("TTS_BACKUP_RECIPIENTS", "")),
            recipients_file=Path(recipients_file).expanduser() if recipients_file else None,
            allow_clear=env_bool("TTS_BACKUP_ALLOW_CLEAR", False),
            keep=env_int("TTS_BACKUP_KEEP", 7),
        )

    @property
    def encrypts(self) -> bool:
        return bool(self.recipients or self.recipients_file)

    def age_command(self) -> list[str]:
        """``age`` encrypting stdin to stdout for every recipient."""
        command = [shutil.which("age") or "age", "--encrypt"]
        for recipient in self.recipients:
            command += ["--recipient", recipient]
        if self.recipients_file is not None:
            command += ["--recipients-file", str(self.recipients_file)]
        return command

    def check(self) -> None:
        """Refuse before the dump: no way to encrypt (and no clear archive asked for), or a bad recipient."""
        if not self.encrypts:
            if not self.allow_clear:
                raise StackError(NO_RECIPIENT)
            return
        if shutil.which("age") is None:
            raise StackError(
                "the `age` command is missing (Debian package `age`; `make bootstrap` installs it)"
            )
        tried = subprocess.run(
            [*self.age_command(), "--output", os.devnull], input=b"", capture_output=True, check=False
        )
        if tried.returncode != 0:
            raise StackError(
                f"age refuses the backup recipients: {tried.stderr.decode(errors='replace').strip()}"
            )


def _pg_env(cfg: StackConfig) -> dict[str, str]:
    return {**os.environ, "PGPASSWORD": cfg.pg_password}


def _pg_args(cfg: StackConfig) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(cfg.pg_port), "-U", "tts"]


@contextlib.contextmanager
def postgres_running(cfg: StackConfig) -> Iterator[None]:
    """The stack's PostgreSQL: the running one, or one started for the duration."""
    if provision.port_in_use(cfg.pg_port):
        yield
        return
    if not provision.pg_initialised(cfg):
        raise StackError(f"no database under {cfg.pg_data}; nothing to back up")
    command, as_user = provision.postgres_command(cfg)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **as_user)
    try:
        _wait_until_accepting(cfg, 60)
        yield
    finally:
        server.terminate()  # smart shutdown: a clean checkpoint, then exit
        server.wait(60)


def _wait_until_accepting(cfg: StackConfig, timeout: float) -> None:
    """The port opens before recovery ends ("the database system is starting up"): ask pg_isready."""
    deadline = time.monotonic() + timeout
    command = [str(provision._pg_bindir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(cfg.pg_port)]
    while subprocess.run(command, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise StackError(f"PostgreSQL on port {cfg.pg_port} not ready after {timeout:.0f}s")
        time.sleep(0.2)


def _media_dir(cfg: StackConfig) -> Path:
    return cfg.path("media")


def add_media(
    archive: tarfile.TarFile, media: Path, arcname: str = "media", only: Collection[str] | None = None
) -> int:
    """Add the media folder's folders and finished files; returns how many vanished meanwhile.

    Each file is opened before its entry is made, and the entry is made from
    the open file: a file removed after the folder was listed (retention, a
    deleted job, a writer's temp file) is skipped, never half-added. Finished
    files are renamed into place whole and never written again, so an open one
    reads whole even if it is unlinked meanwhile.

    With ``only`` (paths relative to ``media``), just those files, and only the
    folders on their way: not even the name of a deleted tenant's folder.
    """
    wanted = None if only is None else {os.path.normpath(p) for p in only}
    on_the_way = set() if wanted is None else {str(parent) for p in wanted for parent in Path(p).parents}
    vanished = 0
    for dirpath, dirnames, filenames in os.walk(media):
        here = Path(dirpath)
        relative = here.relative_to(media)
        if wanted is None:
            dirnames.sort()
        else:
            dirnames[:] = sorted(d for d in dirnames if str(relative / d) in on_the_way)
        try:
            archive.addfile(archive.gettarinfo(here, str(Path(arcname, relative))))
        except FileNotFoundError:
            dirnames.clear()  # the folder itself went: nothing under it to add
            vanished += 1
            continue
        for name in sorted(filenames):
            if is_temp_name(name) or (wanted is not None and str(relative / name) not in wanted):
                continue
            try:
                handle = open(here / name, "rb", opener=_open_no_follow)
            except FileNotFoundError:
                vanished += 1
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue  # a symlink: no file of ours (and a restore refuses links)
                raise
            with handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    continue
                info = archive.gettarinfo(arcname=str(Path(arcname, relative, name)), fileobj=handle)
                archive.addfile(info, handle)
    return vanished


def _open_no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _write_archive(
    out: Path, write: Callable[[tarfile.TarFile], None], encrypt: list[str] | None = None
) -> None:
    """Write a gzipped tar to ``out`` atomically (mode 0600): all of it, or nothing at all.

    With ``encrypt`` (an ``age`` command line reading stdin, writing stdout)
    the tar stream goes through it: the clear archive never touches the disk.
    """
    partial = out.with_name(f".{out.name}.part")
    try:
        with provision.private_umask(), open(partial, "wb") as raw:
            if encrypt is None:
                with tarfile.open(fileobj=raw, mode="w:gz") as archive:
                    write(archive)
            else:
                _write_encrypted(raw, write, encrypt)
            raw.flush()
            os.fsync(raw.fileno())
        partial.chmod(0o600)
        partial.replace(out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    folder = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)  # the rename on disk too
    finally:
        os.close(folder)


def _write_encrypted(raw: BinaryIO, write: Callable[[tarfile.TarFile], None], encrypt: list[str]) -> None:
    age = subprocess.Popen(encrypt, stdin=subprocess.PIPE, stdout=raw, stderr=subprocess.PIPE)
    assert age.stdin is not None and age.stderr is not None
    try:
        with age.stdin, tarfile.open(fileobj=age.stdin, mode="w|gz") as archive:
            write(archive)
    except BaseException:
        age.kill()
        age.wait()
        raise
    errors = age.stderr.read().decode(errors="replace").strip()
    if age.wait() != 0:
        raise StackError(f"age failed: {errors}")


def _dump(cfg: StackConfig, dump: Path) -> set[str]:
    """pg_dump into ``dump``; returns the media paths its rows name, read in the dump's own snapshot.

    The snapshot is exported by a repeatable-read transaction that stays open
    while pg_dump reads it (``--snapshot``): the files kept are exactly those of
    the rows dumped, whatever commits meanwhile.
    """
    with psycopg.connect(cfg.database_url) as db:
        db.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        db.read_only = True
        row = db.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        subprocess.run(
            [
                str(provision._pg_bindir() / "pg_dump"),
                *_pg_args(cfg),
                "--format=custom",
                f"--snapshot={row[0]}",
                *(f"--exclude-table-data={table}" for table in LEFT_OUT_TABLE_DATA),
                "--file",
                str(dump),
                "tts",
            ],
            env=_pg_env(cfg),
            check=True,
        )
        referenced: set[str] = set()
        for table, columns in MEDIA_COLUMNS.items():
            for column in columns:
                query = sql.SQL("SELECT DISTINCT {c} FROM {t} WHERE {c} <> ''").format(
                    c=sql.Identifier(column), t=sql.Identifier(table)
                )
                referenced.update(os.path.normpath(path) for (path,) in db.execute(query))
        db.rollback()
    return referenced


def rotate(folder: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest archives of ``folder`` (by the time in their names); 0 keeps all.

    Only names of this module's archives count (``tts-backup-<time>.tar.gz[.age]``);
    anything else in the folder is left alone. Returns what was deleted.
    """
    if keep <= 0 or not folder.is_dir():
        return []
    archives = sorted(
        (p for p in folder.iterdir() if ARCHIVE_NAME.match(p.name) and p.is_file() and not p.is_symlink()),
        key=lambda p: (ARCHIVE_NAME.match(p.name)[1], p.name),  # type: ignore[index]
        reverse=True,
    )
    for old in archives[keep:]:
        old.unlink(missing_ok=True)
    return archives[keep:]


def backup(cfg: StackConfig, out: Path | None = None, policy: BackupPolicy | None = None) -> Path:
    """Write the archive, then rotate its folder; returns its path.

    ``policy`` defaults to the settings (:meth:`BackupPolicy.from_env`). Older
    archives are deleted only once the new one is complete.
    """
    policy = policy or BackupPolicy.from_env()
    policy.check()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    suffix = ".tar.gz.age" if policy.encrypts else ".tar.gz"
    out = out or cfg.path("backups", f"tts-backup-{stamp}{suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".backup-") as tmp:
        dump = Path(tmp) / "database.dump"
        with postgres_running(cfg):
            referenced = _dump(cfg, dump)
        manifest = {"format": FORMAT_VERSION, "created_at": dt.datetime.now(dt.UTC).isoformat()}
        (Path(tmp) / "manifest.json").write_text(json.dumps(manifest))

        def write(archive: tarfile.TarFile) -> None:
            archive.add(Path(tmp) / "manifest.json", "manifest.json")
            archive.add(dump, "database.dump")
            for name in SECRETS:
                if cfg.path("secrets", name).exists():
                    archive.add(cfg.path("secrets", name), f"secrets/{name}")
            if _media_dir(cfg).is_dir():
                add_media(archive, _media_dir(cfg), only=referenced)

        _write_archive(out, write, policy.age_command() if policy.encrypts else None)
    rotate(out.parent, policy.keep)
    return out


def _check_fresh(cfg: StackConfig) -> None:
    media = _media_dir(cfg)
    if provision.pg_initialised(cfg) or (media.is_dir() and any(media.iterdir())):
        raise StackError(
            f"{cfg.var_dir} already holds a database or media; restore goes into a fresh var/ "
            "(move it away, or `make clean CONFIRM=1`)"
        )


def extract_safely(archive: tarfile.TarFile, destination: Path) -> None:
    """Unpack only plain files and folders that stay inside ``destination``.

    Python's "data" extraction filter does this from 3.11.4 on; Debian 12's
    Python 3.11.2 has none, so the same refusals are made here first whatever
    the Python: an absolute name, a ".." part, or anything but a file or a
    folder (links, devices, FIFOs) ends the restore before anything is written.
    """
    for member in archive.getmembers():
        parts = Path(member.name).parts
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts:
            raise StackError(f"refusing to restore {member.name!r}: not a plain file inside the archive")
    if hasattr(tarfile, "data_filter"):
        archive.extractall(destination, filter="data")
    else:  # nothing left that the filter would refuse (checked above)
        archive.extractall(destination)


def is_encrypted(archive_path: Path) -> bool:
    """An age file (binary or armoured), by its header."""
    with open(archive_path, "rb") as f:
        head = f.read(max(len(h) for h in AGE_HEADERS))
    return head.startswith(AGE_HEADERS)


@contextlib.contextmanager
def _clear_archive(cfg: StackConfig, archive_path: Path, identity: Path | None) -> Iterator[Path]:
    """The archive in clear: itself, or decrypted with ``identity`` into a private folder of var/."""
    if identity is None or not is_encrypted(archive_path):
        yield archive_path
        return
    with tempfile.TemporaryDirectory(dir=cfg.var_dir, prefix=".decrypted-") as folder:
        clear = Path(folder, "archive.tar.gz")
        decrypted = subprocess.run(
            [shutil.which("age") or "age", "--decrypt", "--identity", str(identity), "--output", str(clear)]
            + [str(archive_path)],
            capture_output=True,
            check=False,
        )
        if decrypted.returncode != 0:
            raise StackError(
                f"cannot decrypt {archive_path} with {identity}: "
                + decrypted.stderr.decode(errors="replace").strip()
            )
        yield clear


def restore(cfg: StackConfig, archive_path: Path, identity: Path | None = None) -> None:
    """Bring an archive back into a fresh var/ (an encrypted one with the operator's ``identity``)."""
    _check_fresh(cfg)
    if identity is None and is_encrypted(archive_path):
        raise StackError(
            f"{archive_path} is encrypted: give the age identity (private key) it was made for, "
            "`make restore FILE=... IDENTITY=path/to/key`"
        )
    cfg.var_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.var_dir) as tmp:
        with _clear_archive(cfg, archive_path, identity) as clear, tarfile.open(clear, "r:gz") as archive:
            extract_safely(archive, Path(tmp))
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())
        if manifest.get("format") != FORMAT_VERSION:
            raise StackError(f"{archive_path}: unknown backup format {manifest.get('format')!r}")
        for name in SECRETS:  # before provisioning would generate new ones
            source = Path(tmp, "secrets", name)
            if source.exists():
                write_private(cfg.path("secrets", name), source.read_text())
        provision.prepare_var(cfg)  # the new cluster's password, any secret the archive lacked, the folders
        provision.init_postgres(cfg)
        dump = Path(tmp) / "database.dump"
        with postgres_running(cfg):
            provision.create_database(cfg)
            subprocess.run(
                [str(provision._pg_bindir() / "pg_restore"), *_pg_args(cfg), "--no-owner", "--exit-on-error"]
                + ["--dbname", "tts", str(dump)],
                env=_pg_env(cfg),
                check=True,
            )
        if Path(tmp, "media").is_dir():
            _media_dir(cfg).parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(_media_dir(cfg), ignore_errors=True)
            shutil.move(str(Path(tmp, "media")), _media_dir(cfg))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.backup", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("backup", help="write an archive of the database, media and key secrets")
    make.add_argument(
        "--out", type=Path, help="archive path (default var/backups/tts-backup-<time>.tar.gz.age)"
    )
    make.add_argument(
        "--clear",
        action="store_true",
        help="no recipient configured: write a clear archive (it holds secrets)",
    )
    back = commands.add_parser("restore", help="restore an archive into a fresh var/")
    back.add_argument("file", type=Path)
    back.add_argument(
        "--identity", type=Path, help="the age identity (private key) an encrypted archive is for"
    )
    args = parser.parse_args(argv)
    cfg = StackConfig.from_env()
    try:
        if args.command == "backup":
            policy = BackupPolicy.from_env()
            if args.clear:
                policy = dataclasses.replace(policy, allow_clear=True)
            out = backup(cfg, args.out, policy)
            if not policy.encrypts:
                print(f"warning: {out} is not encrypted and holds every secret of the stack", file=sys.stderr)
            print(f"backup written to {out}")
        else:
            restore(cfg, args.file, args.identity)
            print(f"restored {args.file} into {cfg.var_dir}; start it with `make run`")
    except (StackError, subprocess.CalledProcessError, OSError, tarfile.TarError) as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
