"""The files the service keeps under ``TTS_VAR_DIR``, and the one step that creates them.

Importing the settings only reads: a secret file that is missing means the secret is
absent, a log folder that is missing means no log file. So ``manage.py check``,
``makemigrations --check``, mypy's Django plugin and ruff run on a fresh clone (no
var/ at all) and on a read-only filesystem. :func:`prepare_var` creates the folders
the processes write and the secret files the environment does not replace; it runs as

- ``python manage.py prepare_var`` (webapp/housekeeping/management/commands/), which
  the systemd units run before they start (``ExecStartPre``) and a container runs once
  against its writable volume;
- ``deploy.provision.prepare_var`` for the local stack (`make run`), the test stack
  and a restore, which first adds the PostgreSQL and Redis passwords of that stack.

A process that serves refuses to start without its secrets (:func:`check_ready_to_serve`,
called by webapp/wsgi.py and webapp/asgi.py), naming the command and the variable; a
Celery worker refuses to start where it cannot write a folder its tasks write
(:func:`check_worker_can_write`, called by webapp/celery.py), naming the folder.

Standard library only (Django is imported inside the one function that needs it): the
settings and deploy/ import this module before Django is set up.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webapp.env import env_str

BASE_DIR = Path(__file__).resolve().parent.parent
PREPARE_COMMAND = "python manage.py prepare_var"

logger = logging.getLogger(__name__)


# The names of files some writer is still producing: the synth library writes
# ``.<name>.<hex>.part`` (and ``.part.f32``) next to the final file and renames it
# into place. The orphan sweep leaves them to their writer for a while, and backups
# leave them out (webapp/housekeeping/disk.py, deploy/backup.py).
TEMP_SUFFIXES = (".part", ".partial", ".tmp", ".temp", ".f32")


def is_temp_name(name: str) -> bool:
    """A file some writer is still producing, by the naming conventions in use."""
    if name.startswith((".", "~")):
        return True
    return any(name.endswith(s) or f"{s}." in name for s in TEMP_SUFFIXES)


class MissingSecretError(RuntimeError):
    """A secret a serving process needs is neither in its variable nor in its file."""


class PlaceholderSecretError(RuntimeError):
    """A secret is set to a value from an example file (``CHANGE-ME``): anyone could sign with it."""


# Values the example files ship with, and the ones people type instead of a secret.
PLACEHOLDERS = frozenset(
    {"change-me", "changeme", "change_me", "replace-me", "secret", "password", "placeholder"}
)


def is_placeholder(value: str) -> bool:
    text = value.strip().lower()
    return text in PLACEHOLDERS or "change-me" in text or text.startswith("django-insecure")


class UnwritableFolderError(RuntimeError):
    """A folder a worker's tasks write is one its user cannot write."""


@dataclass(frozen=True)
class Secret:
    setting: str  # the Django setting holding it
    purpose: str
    env: str  # the variable that gives it directly
    file_env: str  # the variable naming its file
    path: Path
    given: str  # the value of ``env``; empty when unset

    def value(self) -> str:
        """The variable's value, else the file's; "" when neither exists (never created here)."""
        return self.given or read_secret(self.path)

    def missing_message(self) -> str:
        return (
            f"{self.setting} is missing ({self.purpose}): {self.env} is not set and {self.path} "
            f"does not exist. Run `{PREPARE_COMMAND}` as the user the service runs as (it creates "
            f"the secret files and folders under TTS_VAR_DIR), or set {self.env} "
            f"(or {self.file_env}, the file that holds it)."
        )


@dataclass(frozen=True)
class VarLayout:
    """Where the settings read and the processes write; the settings take their paths from here."""

    var_dir: Path
    media_root: Path
    static_root: Path
    log_dir: Path
    voices_dir: Path
    secret_key: Secret
    api_key_secret: Secret
    # Where worker children say they are alive and loaded, for exec probes (speech/runtime/probe.py).
    probe_dir: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> VarLayout:
        """The layout ``environ`` (default: this process's environment) describes."""
        env = os.environ if environ is None else environ
        var_dir = Path(env_str("TTS_VAR_DIR", str(BASE_DIR / "var"), env))
        return cls(
            var_dir=var_dir,
            media_root=Path(env_str("TTS_MEDIA_ROOT", str(var_dir / "media"), env)),
            static_root=Path(env_str("TTS_STATIC_ROOT", str(var_dir / "static"), env)),
            log_dir=Path(env_str("TTS_LOG_DIR", str(var_dir / "log"), env)),
            voices_dir=Path(env_str("TTS_VOICES_DIR", str(var_dir / "voices"), env)),
            secret_key=_secret(
                "SECRET_KEY",
                "Django's secret: sessions, CSRF, signed e-mail links",
                "DJANGO_SECRET_KEY",
                var_dir / "secrets" / "django_secret_key",
                env,
            ),
            # API keys are hashed with their own secret, so rotating SECRET_KEY (sessions)
            # does not invalidate every key, and vice versa.
            api_key_secret=_secret(
                "API_KEY_HMAC_SECRET",
                "the HMAC secret API keys are hashed with",
                "TTS_API_KEY_SECRET",
                var_dir / "secrets" / "api_key_secret",
                env,
            ),
            probe_dir=Path(env_str("TTS_WORKER_PROBE_DIR", str(var_dir / "run"), env)),
        )

    @property
    def run_dir(self) -> Path:
        """Beat's schedule, gunicorn's Prometheus folder, the local stack's sockets and pid files."""
        return self.var_dir / "run"

    @property
    def tmp_dir(self) -> Path:
        return self.var_dir / "tmp"

    @property
    def cache_dir(self) -> Path:
        """What a process may rebuild: the analysis worker's profiles of the built-in voices."""
        return self.var_dir / "cache"

    @property
    def jobs_dir(self) -> Path:
        """The jobs running on this host, one file each, by every worker of this var/ (synth.hostjobs)."""
        return self.run_dir / "jobs"

    @property
    def secrets(self) -> tuple[Secret, ...]:
        return (self.secret_key, self.api_key_secret)

    @property
    def folders(self) -> tuple[Path, ...]:
        return (
            self.log_dir,
            self.media_root,
            self.static_root,
            self.run_dir,
            self.jobs_dir,
            self.voices_dir,
            self.tmp_dir,
            self.cache_dir,
        )

    @property
    def worker_folders(self) -> tuple[Path, ...]:
        """The folders a Celery worker's tasks write: audio and prompts, temporary files, caches, job files."""
        return (self.media_root, self.tmp_dir, self.cache_dir, self.jobs_dir)


def _secret(setting: str, purpose: str, variable: str, default: Path, env: Mapping[str, str]) -> Secret:
    """A secret given in ``variable``, else read from the file ``<variable>_FILE`` names (or ``default``)."""
    file_variable = f"{variable}_FILE"
    return Secret(
        setting=setting,
        purpose=purpose,
        env=variable,
        file_env=file_variable,
        path=Path(env_str(file_variable, str(default), env)),
        given=env_str(variable, "", env).strip(),
    )


def read_secret(path: Path) -> str:
    """The secret kept in ``path``; "" when there is no such file. Reads only."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def create_secret(path: Path) -> bool:
    """Create ``path`` holding a new random secret unless it exists; True when this call created it.

    The file is mode 0600 from its first byte and appears complete or not at all (written
    under a name of its own, then linked into place: of two processes at once, one wins
    and the other keeps its file), in a folder made 0700 when this call makes it. The
    secret is a URL-safe token, so it can stand in a database or Redis URL as it is.
    """
    if path.exists():
        return False
    folder = path.parent
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
            folder.chmod(0o700)  # mkdir's mode is narrowed by the umask, never widened: exact here
        except FileExistsError:
            pass  # made meanwhile by another process
    draft = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: written in place, O_EXCL still picks one
            return _create_in_place(path)
        return True
    finally:
        draft.unlink(missing_ok=True)


def _create_in_place(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(50))
    return True


def prepare_var(layout: VarLayout) -> list[Path]:
    """Create the folders the processes write and each secret file its variable does not replace.

    Returns what this call created. Existing folders and secrets are kept as they are
    (their modes too: as root, deploy/privileges.py sets them for the local stack), so it
    runs before every start, and several at once (each systemd unit's ExecStartPre).
    """
    created: list[Path] = []
    for folder in layout.folders:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            created.append(folder)
    for secret in layout.secrets:
        if not secret.given and create_secret(secret.path):
            created.append(secret.path)
    return created


def unwritable(folders: tuple[Path, ...]) -> list[Path]:
    """Those of ``folders`` this process cannot make files in (a missing one: where its parent refuses it)."""
    found = []
    for folder in folders:
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK | os.X_OK):
            found.append(folder)
    return found


def check_worker_can_write(layout: VarLayout) -> None:
    """Refuse to start a worker whose tasks would each fail on a folder it cannot write.

    Called as a Celery worker starts (webapp/celery.py): better one error naming the
    folder at start than every job or voice failing with a PermissionError later.
    """
    folders = unwritable(layout.worker_folders)
    if not folders:
        return
    user = pwd.getpwuid(os.geteuid()).pw_name
    lines = []
    for folder in folders:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        owner = f"{existing.owner()}:{existing.group()} {stat.filemode(existing.stat().st_mode)}"
        where = folder if existing == folder else f"{folder} (missing; {existing} refuses it)"
        lines.append(f"{user} cannot write {where}, owned {owner}")
    raise UnwritableFolderError(
        "\n".join(lines) + f"\nRun `{PREPARE_COMMAND}` as {user}, or give {user} these folders "
        "(as root, `make run` does: deploy/privileges.py)."
    )


def _has_setting(settings: Any, name: str) -> bool:
    from django.core.exceptions import ImproperlyConfigured

    try:
        return bool(getattr(settings, name, ""))
    except ImproperlyConfigured:  # Django's answer for an empty SECRET_KEY
        return False


def check_ready_to_serve() -> None:
    """Refuse to serve without the secrets; say once if the log file cannot be written.

    Called by the web entry points (webapp/wsgi.py, webapp/asgi.py: gunicorn, runserver)
    after Django's set-up. Celery processes do not call it: they never sign anything nor
    hash API keys (and Django refuses any use of an empty SECRET_KEY wherever it happens),
    so a worker node needs no secret; they only warn about the log folder (webapp/celery.py).
    """
    from django.conf import settings

    layout: VarLayout = settings.TTS_VAR_LAYOUT
    missing = [s.missing_message() for s in layout.secrets if not _has_setting(settings, s.setting)]
    if missing:
        raise MissingSecretError("\n".join(missing))
    refuse_placeholder_secrets()
    warn_if_no_log_folder()


def refuse_placeholder_secrets() -> None:
    """Web and Celery processes alike refuse a secret left at an example's value (the Kubernetes
    example Secret's ``CHANGE-ME``): sessions, signed links and API key hashes would be forgeable."""
    from django.conf import settings

    layout: VarLayout = settings.TTS_VAR_LAYOUT
    found = [
        f"{s.setting} is a placeholder ({s.env} or {s.path}): set it to a long random value, e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`"
        for s in layout.secrets
        if _has_setting(settings, s.setting) and is_placeholder(str(getattr(settings, s.setting)))
    ]
    if found:
        raise PlaceholderSecretError("\n".join(found))


def warn_if_no_log_folder() -> None:
    """The settings log to a file only where its folder exists (they create none): say so once at start."""
    from django.conf import settings

    handlers: Any = settings.LOGGING["handlers"]
    if settings.LOG_TO_FILE and "file" not in handlers:
        logger.warning(
            "TTS_LOG_TO_FILE is on but the log folder %s does not exist: logging to stderr only. "
            "Run `%s` to create it, or set TTS_LOG_TO_FILE=0.",
            settings.LOG_DIR,
            PREPARE_COMMAND,
        )


def missing_secret(name: str) -> MissingSecretError:
    """The error for the secret held in setting ``name``, for code that finds it empty when it needs it."""
    from django.conf import settings

    layout: VarLayout = settings.TTS_VAR_LAYOUT
    secret = next(s for s in layout.secrets if s.setting == name)
    return MissingSecretError(secret.missing_message())
