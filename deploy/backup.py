"""Backup and restore of a stack: the PostgreSQL database, the media folder and the key secrets.

``make backup`` (``python -m deploy.backup backup``) writes one archive,
``var/backups/tts-backup-<UTC time>.tar.gz`` (mode 0600), holding:

- ``database.dump``: ``pg_dump --format=custom``, one consistent snapshot of
  the database (pg_dump reads in a single repeatable-read transaction, so the
  stack may keep running);
- ``media/``: the media folder (job audio, voice prompts), copied after the
  dump: a file the dump names exists unless retention removed it meanwhile,
  and a file written after the dump is an orphan the sweep removes. Files
  being written (temp names: ``.<name>.<hex>.part`` and the like) are left
  out, and a file that vanishes while the folder is walked is skipped: the
  stack keeps running while it is backed up;
- ``secrets/``: the API key HMAC secret and Django's secret key: without the
  first, no restored API key would ever verify. Keep the archive private.

``make restore FILE=...`` (``python -m deploy.backup restore FILE``) brings
an archive back into a *fresh* ``var/`` (it refuses one that holds a
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
import datetime as dt
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from deploy import provision
from deploy.provision import StackConfig, StackError
from webapp.env import write_private

SECRETS = ("api_key_secret", "django_secret_key")
FORMAT_VERSION = 1

# The names of files some writer is still producing: the synth library writes
# ``.<name>.<hex>.part`` (and ``.part.f32``) and renames it into place. The same
# rule as the orphan sweep's (webapp/housekeeping/disk.py ``is_temp_name``,
# which deploy/ cannot import: it needs Django; tests/unit/test_backup_archive.py
# checks the two agree).
TEMP_SUFFIXES = (".part", ".partial", ".tmp", ".temp", ".f32")


def is_temp_name(name: str) -> bool:
    if name.startswith((".", "~")):
        return True
    return any(name.endswith(s) or f"{s}." in name for s in TEMP_SUFFIXES)


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


def add_media(archive: tarfile.TarFile, media: Path, arcname: str = "media") -> int:
    """Add the media folder's folders and finished files; returns how many vanished meanwhile.

    Each file is opened before its entry is made, and the entry is made from
    the open file: a file removed after the folder was listed (retention, a
    deleted job, a writer's temp file) is skipped, never half-added. Finished
    files are renamed into place whole and never written again, so an open one
    reads whole even if it is unlinked meanwhile.
    """
    vanished = 0
    for dirpath, dirnames, filenames in os.walk(media):
        here = Path(dirpath)
        dirnames.sort()
        relative = here.relative_to(media)
        try:
            archive.addfile(archive.gettarinfo(here, str(Path(arcname, relative))))
        except FileNotFoundError:
            dirnames.clear()  # the folder itself went: nothing under it to add
            vanished += 1
            continue
        for name in sorted(filenames):
            if is_temp_name(name):
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


def _write_archive(out: Path, write: Callable[[tarfile.TarFile], None]) -> None:
    """Write a gzipped tar to ``out`` atomically (mode 0600): all of it, or nothing at all."""
    partial = out.with_name(f".{out.name}.part")
    try:
        with provision.private_umask(), open(partial, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as archive:
                write(archive)
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


def backup(cfg: StackConfig, out: Path | None = None) -> Path:
    """Write the archive; returns its path."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out = out or cfg.path("backups", f"tts-backup-{stamp}.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".backup-") as tmp:
        dump = Path(tmp) / "database.dump"
        with postgres_running(cfg):
            subprocess.run(
                [
                    str(provision._pg_bindir() / "pg_dump"),
                    *_pg_args(cfg),
                    "--format=custom",
                    "--file",
                    str(dump),
                    "tts",
                ],
                env=_pg_env(cfg),
                check=True,
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
                add_media(archive, _media_dir(cfg))

        _write_archive(out, write)
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


def restore(cfg: StackConfig, archive_path: Path) -> None:
    """Bring an archive back into a fresh var/."""
    _check_fresh(cfg)
    cfg.var_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.var_dir) as tmp:
        with tarfile.open(archive_path, "r:gz") as archive:
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
    make.add_argument("--out", type=Path, help="archive path (default var/backups/tts-backup-<time>.tar.gz)")
    back = commands.add_parser("restore", help="restore an archive into a fresh var/")
    back.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    cfg = StackConfig.from_env()
    try:
        if args.command == "backup":
            print(f"backup written to {backup(cfg, args.out)}")
        else:
            restore(cfg, args.file)
            print(f"restored {args.file} into {cfg.var_dir}; start it with `make run`")
    except (StackError, subprocess.CalledProcessError, OSError, tarfile.TarError) as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
