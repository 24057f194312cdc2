"""Who runs what in the local stack, and who may read what under var/ (as root).

PostgreSQL runs as ``tts-pg`` (it refuses root); gunicorn's workers and Celery
run as ``tts-app``, whose group Nginx's workers share (the socket is 0660, audio
0640); Nginx's temporary folders are its own (deploy/nginx.py).
"""

from __future__ import annotations

import functools
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploy.provision import StackConfig

PG_SYSTEM_USER = "tts-pg"
APP_SYSTEM_USER = "tts-app"


def is_root() -> bool:
    return os.geteuid() == 0


def system_user(name: str) -> pwd.struct_passwd | None:
    """As root: the unprivileged system user ``name`` (created on first use, with its own group)."""
    if not is_root():
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        # Another stack starting at the same moment may create it first: check again after.
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
        )
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise RuntimeError(f"could not create the system user {name} (useradd)") from None


def pg_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: then it runs as an unprivileged system user."""
    return system_user(PG_SYSTEM_USER)


def app_user() -> pwd.struct_passwd | None:
    """As root, gunicorn's workers and Celery run as this user; Nginx's workers share its group."""
    return system_user(APP_SYSTEM_USER)


def chown_tree(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, user.pw_uid, user.pw_gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), user.pw_uid, user.pw_gid)


def as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


# The project's folder: the app user reads its code (and .venv's packages) from here.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def others_can_use(path: Path) -> bool:
    """Whether a user with no rights of its own can run ``path`` or list and enter it (every folder above searchable)."""
    folders_ok = all(folder.stat().st_mode & 0o001 for folder in path.parents)
    return folders_ok and path.stat().st_mode & 0o005 == 0o005


@functools.cache
def process_user() -> pwd.struct_passwd | None:
    """The user `make run`'s Django processes run as: the app user, when root and it can run our Python
    and read the project (deploy/bootstrap.sh builds .venv on such a Python when it can)."""
    user = app_user()
    if user is None:
        return None
    python = Path(sys.executable).resolve()
    for path, what in ((PROJECT_ROOT, f"read the project in {PROJECT_ROOT}"), (python, f"run {python}")):
        if not others_can_use(path):
            _say_root_fallback(what, project=path == PROJECT_ROOT)
            return None
    return user


def _say_root_fallback(what: str, project: bool) -> None:
    """Loud, on stderr, with the fix: running the app as root is a security problem, not a detail."""
    rebuild = "rm -rf .venv && make run  (deploy/bootstrap.sh rebuilds .venv on /usr/bin/python3.11)"
    fix = (
        [f"Move the checkout to a folder other users can enter (not under /root), then: {rebuild}"]
        if project
        else [f"{rebuild}, or build .venv on a Python outside private folders"]
    )
    rule = "stack: " + "*" * 78
    lines = [
        rule,
        f"stack: WARNING: gunicorn and Celery run AS ROOT, not as {APP_SYSTEM_USER}:",
        f"stack: {APP_SYSTEM_USER} cannot {what} (a folder above it is private), so gunicorn and Celery run as root.",
        "stack: Any flaw in the app or a library it loads then has the whole machine.",
        *(f"stack: To fix: {line}" for line in fix),
        rule,
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def as_app_user() -> dict[str, Any]:
    """Popen arguments for a Celery process of `make run`: the app user, files not world-readable."""
    user = process_user()
    return {**as_user(user), "umask": 0o027} if user is not None else {}


# Folders the app user writes (audio, uploads, temporary files, mail files, its HOME and the
# analysis worker's caches, the running jobs' files); every one webapp.provisioning's
# VarLayout.worker_folders names is here, or a worker refuses to start.
APP_WRITABLE = ("media", "tmp", "voices", "mail", "home", "cache", "run/jobs")


def secure_var_dir(cfg: StackConfig) -> None:
    """As root, before `make run` starts the app tier: who may read and write what under var/.

    Media, temporary files and caches (beat's schedule too) belong to the app user
    (mode 0750: Nginx reads audio through the group); logs (written by the supervisor)
    and var/run are 0750 root, the app user's var/run/jobs inside. Nothing is writable
    by the group Nginx's workers share. The app's two secrets become the app user's;
    the PostgreSQL and Redis passwords stay root's.
    """
    user = app_user()
    if user is None:
        return
    for folder in APP_WRITABLE:
        cfg.path(folder).mkdir(parents=True, exist_ok=True)
        chown_tree(cfg.path(folder), user)
        cfg.path(folder).chmod(0o750)
    # The group may enter and read, never write: Nginx's workers are in it (for the socket and audio).
    for folder, mode in (("log", 0o750), ("run", 0o750), ("secrets", 0o711)):
        cfg.path(folder).mkdir(parents=True, exist_ok=True)
        os.chown(cfg.path(folder), 0, user.pw_gid)
        cfg.path(folder).chmod(mode)
    for name in ("django_secret_key", "api_key_secret"):
        secret = cfg.path("secrets", name)
        if secret.exists():
            os.chown(secret, user.pw_uid, user.pw_gid)
