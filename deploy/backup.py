"""Backup and restore of a stack: the PostgreSQL database, the media folder and the key secrets.

``make backup`` (``python -m deploy.backup backup``) writes one archive,
``tts-backup-<UTC time>.tar.gz.age`` (mode 0600) in ``TTS_BACKUP_DIR`` (default
``var/backups``; a folder set there must exist: it may be another disk's,
mounted), encrypted with age to the operator's public key(s)
(``TTS_BACKUP_RECIPIENTS``, ``TTS_BACKUP_RECIPIENTS_FILE``): the key that opens
it is held outside ``var/``. Without a recipient it refuses, unless a clear
``.tar.gz`` is asked for (``make backup CLEAR=1``). Then all but the
``TTS_BACKUP_KEEP`` newest archives of the folder are deleted. The archive holds:

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

A backup never takes the last ``TTS_BACKUP_MIN_FREE_BYTES`` of its folder's
disk (:class:`SpaceGuard`): it refuses, before writing anything, one that its
estimate says would not fit, checks again once the dump's real size is known,
and reads the free space while pg_dump runs and every MiB of the archive,
stopping (pg_dump ended, the partial archive removed) when it falls below.
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
from typing import IO, BinaryIO, cast

import psycopg
from psycopg import sql

from deploy import provision
from deploy.provision import StackConfig, StackError
from webapp.env import EnvError, env_bool, env_int, env_list, env_str, write_private
from webapp.provisioning import is_temp_name

SECRETS = ("api_key_secret", "django_secret_key")
FORMAT_VERSION = 1
MIB = 1 << 20
# What a backup leaves free on its folder's disk by default: the room the sentence cache leaves
# (TTS_SENTENCE_CACHE_MIN_FREE_BYTES) for new audio and the database when the disk is theirs too.
DEFAULT_MIN_FREE_BYTES = 1 << 30
# The free space is read every this many bytes of the archive: one statvfs beside a MiB written
# costs nothing, and at most a MiB goes to the disk after it crossed the reserve.
CHECK_EVERY_BYTES = MIB
# ... and this often while pg_dump writes the dump (its writes are its own: only the disk is seen).
DUMP_CHECK_SECONDS = 0.1
# What an archive adds to the bytes it holds: a tar header and padding per member (at most 1 KiB),
# and gzip's and age's framing (a fraction of a percent), bounded by a MiB on top.
MEMBER_OVERHEAD = 1024

# The columns whose rows name files of the media folder (paths relative to it):
# a backup carries those files and no others. Django's names, which deploy/
# cannot import (tests/unit/test_backup_media.py checks them against the models).
MEDIA_COLUMNS = {
    "speech_synthesisjob": ("audio_path",),
    "speech_voice": ("prompt_path", "original_path"),
    "speech_voiceconsent": ("recording_path",),
}
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
    # Where archives go; None: the stack's var/backups (made when missing).
    folder: Path | None = None
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES

    @classmethod
    def from_env(cls) -> BackupPolicy:
        recipients_file = env_str("TTS_BACKUP_RECIPIENTS_FILE", "")
        folder = env_str("TTS_BACKUP_DIR", "").strip()
        min_free_bytes = env_int("TTS_BACKUP_MIN_FREE_BYTES", DEFAULT_MIN_FREE_BYTES)
        if min_free_bytes < 0:
            raise EnvError(f"TTS_BACKUP_MIN_FREE_BYTES={min_free_bytes} is below 0")
        return cls(
            recipients=tuple(env_list("TTS_BACKUP_RECIPIENTS", "")),
            recipients_file=Path(recipients_file).expanduser() if recipients_file else None,
            allow_clear=env_bool("TTS_BACKUP_ALLOW_CLEAR", False),
            keep=env_int("TTS_BACKUP_KEEP", 7),
            folder=Path(folder).expanduser().absolute() if folder else None,
            min_free_bytes=min_free_bytes,
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
        """Refuse before the dump: no way to encrypt (and no clear archive asked for), a bad recipient,
        or a configured folder that is not there."""
        if self.folder is not None and not self.folder.is_dir():
            # Not made here: a folder on a disk that is not mounted would be made on the disk beneath,
            # the one the backup was kept off.
            raise StackError(
                f"TTS_BACKUP_DIR={self.folder} does not exist (is its disk mounted?); make the folder first"
            )
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


class BackupSpaceError(StackError):
    """The backup's disk has, or was left with, less free space than the backup must leave."""


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MIB:.1f} MiB"


@dataclasses.dataclass
class SpaceGuard:
    """The free space of the disk a backup writes to, against what must stay free there."""

    folder: Path
    reserve: int
    doing: str = "starting"  # what the backup is writing, for the message when the disk fills
    written: int = 0  # bytes of the dump, then of the archive, written so far

    def free(self) -> int:
        # What an unprivileged writer may still use (statvfs f_bavail): the service's processes.
        return shutil.disk_usage(self.folder).free

    def require(self, needed: int = 0, what: str = "") -> None:
        """Refuse when ``needed`` more bytes (``what``) would leave less than the reserve free."""
        free = self.free()
        if free - needed < self.reserve:
            raise BackupSpaceError(
                f"not enough free space for the backup in {self.folder}: {_size(free)} is free, "
                f"TTS_BACKUP_MIN_FREE_BYTES keeps {_size(self.reserve)} of it free"
                + (f", and it needs about {_size(needed)} more ({what})" if needed else "")
                + ". Nothing of the backup is left; free some space, point TTS_BACKUP_DIR at a "
                "folder on a larger disk, or lower TTS_BACKUP_MIN_FREE_BYTES"
            )

    def check(self) -> None:
        """Stop the backup when the free space fell below the reserve (another writer filled the disk)."""
        free = self.free()
        if free < self.reserve:
            raise self.filled(free)

    def filled(self, free: int) -> BackupSpaceError:
        return BackupSpaceError(
            f"the disk of {self.folder} filled up while {self.doing}: {_size(free)} free, below "
            f"TTS_BACKUP_MIN_FREE_BYTES ({_size(self.reserve)}). The backup stopped after writing "
            f"{_size(self.written)} and removed it; the service was not touched"
        )


class _GuardedStream:
    """What the archive's bytes go through on their way to the disk (or to age): counted, and the
    free space read every CHECK_EVERY_BYTES."""

    def __init__(self, target: IO[bytes], guard: SpaceGuard) -> None:
        self._target = target
        self._guard = guard
        self._next_check = guard.written + CHECK_EVERY_BYTES

    def write(self, data: bytes) -> int:
        self._target.write(data)
        self._guard.written += len(data)
        if self._guard.written >= self._next_check:
            self._guard.check()
            self._next_check = self._guard.written + CHECK_EVERY_BYTES
        return len(data)

    def flush(self) -> None:
        self._target.flush()


def _guarded(target: IO[bytes], guard: SpaceGuard | None) -> IO[bytes]:
    """``target`` itself, or through ``guard`` (tarfile and gzip call only write and flush on it)."""
    return target if guard is None else cast(IO[bytes], _GuardedStream(target, guard))


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
    out: Path,
    write: Callable[[tarfile.TarFile], None],
    encrypt: list[str] | None = None,
    guard: SpaceGuard | None = None,
) -> None:
    """Write a gzipped tar to ``out`` atomically (mode 0600): all of it, or nothing at all.

    With ``encrypt`` (an ``age`` command line reading stdin, writing stdout)
    the tar stream goes through it: the clear archive never touches the disk.
    With ``guard``, the stream is counted and the disk's free space read as it goes.
    """
    partial = out.with_name(f".{out.name}.part")
    try:
        with provision.private_umask(), open(partial, "wb") as raw:
            if encrypt is None:
                with tarfile.open(fileobj=_guarded(raw, guard), mode="w:gz") as archive:
                    write(archive)
            else:
                _write_encrypted(raw, write, encrypt, guard)
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


def _write_encrypted(
    raw: BinaryIO, write: Callable[[tarfile.TarFile], None], encrypt: list[str], guard: SpaceGuard | None
) -> None:
    age = subprocess.Popen(encrypt, stdin=subprocess.PIPE, stdout=raw, stderr=subprocess.PIPE)
    assert age.stdin is not None and age.stderr is not None
    try:
        with age.stdin, tarfile.open(fileobj=_guarded(age.stdin, guard), mode="w|gz") as archive:
            write(archive)
    except BrokenPipeError as exc:  # age stopped reading: its own words say why (a full disk, say)
        errors = age.stderr.read().decode(errors="replace").strip()
        age.wait()
        raise StackError(f"age failed: {errors or 'it stopped reading'}") from exc
    except BaseException:
        age.kill()
        age.wait()
        raise
    errors = age.stderr.read().decode(errors="replace").strip()
    if age.wait() != 0:
        raise StackError(f"age failed: {errors}")


@dataclasses.dataclass(frozen=True)
class Dumped:
    """What the dump's rows name in the media folder, and those files' bytes when they were counted."""

    media: set[str]
    media_bytes: int

    @property
    def overhead(self) -> int:
        """What the archive adds to the bytes it holds (headers, framing), over-counted."""
        return MEMBER_OVERHEAD * (len(self.media) + 8) + MIB


def _media_bytes(media: Path, paths: Collection[str]) -> int:
    total = 0
    for relative in paths:
        with contextlib.suppress(OSError):  # gone (retention) or never there: not in the archive either
            total += (media / relative).lstat().st_size
    return total


def _run_watched(command: list[str], env: dict[str, str], guard: SpaceGuard, growing: Path) -> None:
    """Run ``command``, which writes ``growing``, ending it if the disk falls below the reserve meanwhile."""
    process = subprocess.Popen(command, env=env)
    try:
        while True:
            try:
                process.wait(DUMP_CHECK_SECONDS)
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    guard.written = growing.stat().st_size
                guard.check()
    except BaseException:
        # pg_dump's locks (ACCESS SHARE on every table) and its session end with it, not later.
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)


def _dump(cfg: StackConfig, dump: Path, guard: SpaceGuard) -> Dumped:
    """pg_dump into ``dump``; returns the media paths its rows name, read in the dump's own snapshot.

    The snapshot is exported by a repeatable-read transaction that stays open
    while pg_dump reads it (``--snapshot``): the files kept are exactly those of
    the rows dumped, whatever commits meanwhile. Before pg_dump starts, the
    whole backup's size is estimated and refused if it would not fit (``guard``).
    """
    with psycopg.connect(cfg.database_url) as db:
        db.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        db.read_only = True
        row = db.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        referenced: set[str] = set()
        for table, columns in MEDIA_COLUMNS.items():
            for column in columns:
                query = sql.SQL("SELECT DISTINCT {c} FROM {t} WHERE {c} <> ''").format(
                    c=sql.Identifier(column), t=sql.Identifier(table)
                )
                referenced.update(os.path.normpath(path) for (path,) in db.execute(query))
        dumped = Dumped(referenced, _media_bytes(_media_dir(cfg), referenced))
        size = db.execute("SELECT pg_database_size(current_database())").fetchone()
        assert size is not None
        # The database's size on disk stands for the dump file and its copy in the archive together:
        # a custom-format dump is compressed and holds no index. The dump's real size is checked next.
        needed = int(size[0]) + dumped.media_bytes + dumped.overhead
        guard.require(needed, f"the database's size for its dump, {_size(dumped.media_bytes)} of media")
        guard.doing = "dumping the database"
        _run_watched(
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
            _pg_env(cfg),
            guard,
            dump,
        )
        db.rollback()
    return dumped


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
    archives are deleted only once the new one is complete. The dump is written
    next to the archive, on the backup's disk, never on the database's or media's
    (unless that is the same disk); neither may take its last
    ``policy.min_free_bytes`` (:class:`SpaceGuard`).
    """
    policy = policy or BackupPolicy.from_env()
    policy.check()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    suffix = ".tar.gz.age" if policy.encrypts else ".tar.gz"
    out = out or (policy.folder or cfg.path("backups")) / f"tts-backup-{stamp}{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    guard = SpaceGuard(out.parent, policy.min_free_bytes)
    guard.require()  # already below the reserve: not even PostgreSQL is started
    try:
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".backup-") as tmp:
            dump = Path(tmp) / "database.dump"
            with postgres_running(cfg):
                dumped = _dump(cfg, dump, guard)
            guard.doing, guard.written = "writing the archive", 0
            needed = dump.stat().st_size + dumped.media_bytes + dumped.overhead
            guard.require(
                needed,
                f"the archive of the {_size(dump.stat().st_size)} dump, {_size(dumped.media_bytes)} of media",
            )
            manifest = {"format": FORMAT_VERSION, "created_at": dt.datetime.now(dt.UTC).isoformat()}
            (Path(tmp) / "manifest.json").write_text(json.dumps(manifest))

            def write(archive: tarfile.TarFile) -> None:
                archive.add(Path(tmp) / "manifest.json", "manifest.json")
                archive.add(dump, "database.dump")
                for name in SECRETS:
                    if cfg.path("secrets", name).exists():
                        archive.add(cfg.path("secrets", name), f"secrets/{name}")
                if _media_dir(cfg).is_dir():
                    add_media(archive, _media_dir(cfg), only=dumped.media)

            _write_archive(out, write, policy.age_command() if policy.encrypts else None, guard)
    except (OSError, StackError, subprocess.CalledProcessError) as exc:
        # Whatever reported it first (pg_dump, age, a write), a full disk is named as the cause.
        if isinstance(exc, BackupSpaceError):
            raise
        free = guard.free()
        if free < guard.reserve or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            raise guard.filled(free) from exc
        raise
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
        "--out",
        type=Path,
        help="archive path (default TTS_BACKUP_DIR, or var/backups, /tts-backup-<time>.tar.gz.age)",
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
