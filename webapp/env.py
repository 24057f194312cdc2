"""Typed, strict reading of environment variables, shared by settings and deploy/.

Standard library only: ``webapp/settings.py``, ``deploy/`` (the local stack, the
Nginx renderer) and ``deploy/gunicorn.conf.py`` all read their settings through
these helpers, so a variable means the same thing everywhere. A value that does
not parse is a start-up error naming the variable, never a silent default: a
typo in ``DJANGO_DEBUG=ture`` must not quietly turn something off.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class EnvError(ValueError):
    """A variable whose value cannot be used; the message names it."""


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    return None if value is None or value.strip() == "" else value.strip()


def env_str(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    value = (os.environ if environ is None else environ).get(name)
    return default if value is None else value


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    raw = _raw(name, environ)
    if raw is None:
        return default
    # int() accepts "²" and "1_000"; a setting must be plain ASCII digits.
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()):
        raise EnvError(f"{name}={raw!r} is not a whole number")
    return int(raw)


def env_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    raw = _raw(name, environ)
    if raw is None:
        return default
    try:
        if not raw.isascii():
            raise ValueError
        return float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number") from None


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    raw = _raw(name, environ)
    if raw is None:
        return default
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use one of: 1/0, true/false, yes/no, on/off)")


def env_choice(
    name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] | None = None
) -> str:
    value = _raw(name, environ)
    if value is None:
        return default
    if value not in choices:
        raise EnvError(f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


def env_list(name: str, default: str, environ: Mapping[str, str] | None = None) -> list[str]:
    return [item.strip() for item in env_str(name, default, environ).split(",") if item.strip()]


def env_map(name: str, default: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``a=b,c=d`` -> {"a": "b", "c": "d"}."""
    result: dict[str, str] = {}
    for item in env_list(name, default, environ):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise EnvError(f"{name}: {item!r} is not like name=value")
        result[key.strip()] = value.strip()
    return result


def env_networks(
    name: str, default: str, environ: Mapping[str, str] | None = None
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``127.0.0.1,10.0.0.0/8,::1`` -> networks (an address alone is its /32 or /128)."""
    networks = []
    for item in env_list(name, default, environ):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise EnvError(f"{name}: {item!r} is not an IP address or CIDR like 10.0.0.0/8") from None
    return networks


def env_origin(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """An origin like ``https://tts.example.com`` or ``https://localhost:8443``: scheme and host only."""
    value = env_str(name, default, environ).strip().rstrip("/")
    parts = urlsplit(value)
    try:
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise EnvError(f"{name}={value!r} has a port that is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise EnvError(f"{name}={value!r} is not an origin like https://tts.example.com (no path)")
    return value


def write_private(path: Path, text: str) -> None:
    """Write a config file that holds a secret: mode 0600 from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older tmp file may have had another mode
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


# Worker shape, defined once: settings (for Celery and the worker code), the local
# stack and the systemd units (which pass neither --concurrency nor their own
# defaults, and name queues by the same rule) all take these.
WORKER_CONCURRENCY_DEFAULT = 2
HOUSEKEEPING_CONCURRENCY_DEFAULT = 2
WORKER_ENGINES_DEFAULT = "piper,espeak"
HOUSEKEEPING_QUEUES = ("default", "housekeeping")
# The host names the site serves: Django's ALLOWED_HOSTS and Nginx's server_name.
ALLOWED_HOSTS_DEFAULT = "localhost,127.0.0.1,[::1]"


def worker_queues(role: str, engines: list[str]) -> list[str]:
    """The queues a worker of ``role`` consumes: one per engine, or the housekeeping pair."""
    if role == "housekeeping":
        return list(HOUSEKEEPING_QUEUES)
    if role == "analysis":
        return ["analysis"]  # voice prompts (webapp/speech/runtime/analysis.py)
    if role == "webhooks":
        # The webhook outbox (webapp/webhooks/tasks.py): no slow receiver holds a synthesis worker.
        return ["webhooks"]
    return [f"synth.{engine}" for engine in engines]


# What one SQL statement of a process may take, in seconds, by what the process is (0: no limit).
# Lock waits count: a statement queued behind a migration's lock ends too, instead of holding a
# web thread or a worker's job for as long as the lock lasts.
DEFAULT_PROCESS_NAME = "django"  # TTS_PROCESS_NAME when none is set
STATEMENT_TIMEOUTS = {
    "web": 15,  # a request: the client is told 503 and retries
    "synth": 30,
    "analysis": 30,
    "webhooks": 30,
    "housekeeping": 120,  # batches of deletes and updates
    "beat": 30,
    "migrate": 1800,  # an index built CONCURRENTLY over years of rows; lock waits end sooner (lock_timeout)
}


def process_kind(process_name: str, worker_role: str) -> str:
    """What a process is, for its limits: web, migrate or beat by its name (TTS_PROCESS_NAME, as the
    supervisor, the systemd units and the Kubernetes manifests set it), ``other`` with no name (a
    shell, a management command, a backup), and any other named process a Celery worker of its role
    (TTS_WORKER_ROLE)."""
    if process_name in ("gunicorn", "web"):
        return "web"
    if process_name in ("migrate", "beat"):
        return process_name
    if process_name in ("", DEFAULT_PROCESS_NAME):
        return "other"
    return worker_role
