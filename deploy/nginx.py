"""Render nginx/nginx.conf.template (and nginx/snippets/) into var/nginx/.

Placeholders look like ``{{NAME}}`` (Nginx itself uses ``$name``). Values come
from the stack config and environment variables: the TTS_NGINX_* ones are
documented in docs/nginx.md; the body, upload, timeout and X-Accel-Redirect
values come from the same variables Django reads (webapp/settings.py), so the
two never disagree.

Standard library only, like deploy/stack.py; settings are read through webapp/env.py.
"""

from __future__ import annotations

import ipaddress
import math
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from deploy.privileges import APP_SYSTEM_USER, app_user
from deploy.provision import StackConfig, ensure_certificate
from webapp.env import ALLOWED_HOSTS_DEFAULT, EnvError, env_float, env_int, env_list

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "nginx"
SNIPPET_DIR = TEMPLATE_DIR / "snippets"

# Same base as webapp.problems.PROBLEM_BASE (this module cannot import Django).
PROBLEM_BASE = "https://docs.tts.local/problems/"

# TTS_NGINX_<NAME>: default. Documented in docs/nginx.md.
DEFAULTS: dict[str, str] = {
    "RATE_GENERAL": "20r/s",
    "BURST_GENERAL": "40",
    "RATE_KEYED_GENERAL": "200r/s",
    "BURST_KEYED_GENERAL": "1000",
    # POSTs without credentials (strict) and with an API key (a flood guard well
    # above the largest plan's rate: Django enforces each tenant's own limit).
    "RATE_WRITE": "2r/s",
    "BURST_WRITE": "5",
    "RATE_KEYED_WRITE": "50r/s",
    "BURST_KEYED_WRITE": "200",
    "RATE_LOGIN": "10r/m",
    "BURST_LOGIN": "5",
    # Voice-prompt uploads (API and dashboard), per address: each starts a decode. Django
    # bounds each tenant's uploads and the host's decodes (webapp/speech/services/decodes.py).
    "RATE_UPLOAD": "30r/m",
    "BURST_UPLOAD": "10",
    # Uploads this Nginx passes to the app at once, every address together: beyond it a burst
    # is refused here (503 decoder_busy, Retry-After), before its bodies reach a web worker.
    # Above the app's own queue (TTS_PROMPT_DECODES_PER_HOST + TTS_PROMPT_DECODE_QUEUE, 10 by
    # default) so the app's bounds and answers still apply; raise it for an edge in front of
    # several web hosts.
    "CONN_UPLOAD": "16",
    # Realtime sessions open at once per address (WS /v1/audio/speech/stream), each holding its
    # connection for minutes: a flood guard above one tenant's cap (TTS_SESSIONS_PER_TENANT, 50),
    # since several tenants' agents may sit behind one address; Django caps each key and tenant.
    "CONN_SESSIONS_PER_IP": "100",
    # A session's socket: the longest silence from the app (read) and the longest a write to it may
    # block (send). Sessions end themselves long before (TTS_SESSION_IDLE_SECONDS, pings every 20 s,
    # TTS_SESSION_MAX_SECONDS): these only end a socket the app lost track of.
    "SESSION_READ_TIMEOUT": "3600s",
    "SESSION_SEND_TIMEOUT": "60s",
    "CONN_PER_IP": "50",
    "CONN_PER_KEYED_IP": "1024",
    "WORKER_PROCESSES": "auto",
    "HSTS_MAX_AGE": "31536000",
    "REAL_IP_FROM": "",
    "REAL_IP_HEADER": "X-Forwarded-For",
    "LISTEN": "",
    # Templates keep to this: no inline script or style, no CDN.
    "CSP": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "media-src 'self' blob:; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
    # The API reference (/api/docs) only: Redoc builds its styles at run time, so inline
    # styles there, and runs its search index in a worker made from a blob; still no inline
    # script and nothing from elsewhere.
    "DOCS_CSP": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'",
    # Between two reads of a request's headers or body, and two writes of its answer.
    "CLIENT_HEADER_TIMEOUT": "10s",
    "CLIENT_BODY_TIMEOUT": "30s",
    "SEND_TIMEOUT": "30s",
    # The send buffer of each client connection (SO_SNDBUF; the kernel doubles it), fixed instead of
    # autotuned: audio counts as delivered once Nginx took it, so what a client that stops reading
    # is charged and never hears is bounded by this (autotuned on loopback: megabytes). "0": the
    # kernel's autotuning. Throughput per connection is at most about twice this per round trip.
    "SNDBUF": "64k",
}
# Beyond the file itself a multipart upload carries boundaries, part headers and
# the other form fields. Django enforces the exact file limit with a clear
# message; Nginx only has to stop bodies that cannot possibly be valid.
MULTIPART_SLACK_BYTES = 64 * 1024
# Time Django may still need after its own wait ends (encode, write the response).
TIMEOUT_MARGIN_SECONDS = 15

_RATE_RE = re.compile(r"^([1-9][0-9]*)r/([sm])$")
_SIZE_RE = re.compile(r"^[0-9]+[kKmMgG]?$")
_TIME_RE = re.compile(r"^[1-9][0-9]*(ms|s|m)?$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9-]+$")


class NginxConfigError(EnvError):
    """A setting Nginx cannot use; the message names the variable."""


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return env_int(name, default, env)
    except EnvError as exc:
        raise NginxConfigError(str(exc)) from None


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return env_float(name, default, env)
    except EnvError as exc:
        raise NginxConfigError(str(exc)) from None


def _check(name: str, value: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.match(value):
        raise NginxConfigError(f"TTS_NGINX_{name}={value!r} is not {what}")
    return value


def retry_after_seconds(rate: str) -> int:
    """Seconds until a rejected client gets one request through again (one leak interval)."""
    match = _RATE_RE.match(rate)
    if not match:
        raise NginxConfigError(f"rate {rate!r} is not like 5r/s or 10r/m")
    count, unit = int(match.group(1)), match.group(2)
    period = 1 if unit == "s" else 60
    return max(1, math.ceil(period / count))


def _real_ip_block(sources: str, header: str) -> str:
    """real_ip mode: behind a load balancer, trust its address header, only from it."""
    if not sources.strip():
        return ""
    lines = []
    for item in sources.split(","):
        item = item.strip()
        if not item:
            continue
        if item != "unix:":
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise NginxConfigError(
                    f"TTS_NGINX_REAL_IP_FROM: {item!r} is not an address or CIDR"
                ) from None
        lines.append(f"    set_real_ip_from {item};\n")
    lines.append(f"    real_ip_header {header};\n")
    # With a chain of trusted proxies, take the last address none of them added.
    lines.append("    real_ip_recursive on;\n")
    return "".join(lines)


def allow_lines(name: str, sources: str) -> str:
    """``allow`` lines for a location from the addresses or CIDRs in setting ``name`` (deny all follows)."""
    lines = []
    for item in (s.strip() for s in sources.split(",")):
        if not item:
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise NginxConfigError(f"{name}: {item!r} is not an address or CIDR") from None
        lines.append(f"            allow {item};\n")
    return "".join(lines)


def metrics_allow(sources: str) -> str:
    """``allow`` lines for /metrics from TTS_METRICS_ALLOWED_IPS (the list Django checks too)."""
    return allow_lines("TTS_METRICS_ALLOWED_IPS", sources)


_HOST_RE = re.compile(r"^(\.?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?|\[[0-9A-Fa-f:.]+\])$")


def server_names(hosts: list[str]) -> str:
    """Nginx ``server_name`` for Django's ALLOWED_HOSTS (one setting, DJANGO_ALLOWED_HOSTS, for both).

    ``.example.com`` means the name and its subdomains in both; ``*`` (any name)
    becomes a pattern matching every non-empty name. Any other Host gets 421
    from the default server and never reaches Django.
    """
    names = []
    for host in hosts:
        if host == "*":
            names.append("~.")
        elif _HOST_RE.match(host):
            names.append(host)
        else:
            raise NginxConfigError(f"DJANGO_ALLOWED_HOSTS: {host!r} is not a host name, address or *")
    if not names:
        raise NginxConfigError("DJANGO_ALLOWED_HOSTS is empty: Nginx would answer every name with 421")
    return " ".join(names)


def ensure_dhparam(path: Path) -> Path:
    """RFC 7919 ffdhe2048 group for the DHE suites of Mozilla "intermediate" (no generation run)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "openssl",
                "genpkey",
                "-genparam",
                "-algorithm",
                "DH",
                "-pkeyopt",
                "group:ffdhe2048",
                "-out",
                str(path),
            ],
            check=True,
            capture_output=True,
        )
    return path


def _checked_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The TTS_NGINX_* values (without the prefix), each checked against what Nginx accepts."""
    raw = {key: env.get(f"TTS_NGINX_{key}", default) for key, default in DEFAULTS.items()}
    for key in (
        "RATE_GENERAL",
        "RATE_KEYED_GENERAL",
        "RATE_WRITE",
        "RATE_KEYED_WRITE",
        "RATE_LOGIN",
        "RATE_UPLOAD",
    ):
        _check(key, raw[key], _RATE_RE, "a rate like 5r/s or 10r/m")
    for key in (
        "BURST_GENERAL",
        "BURST_KEYED_GENERAL",
        "BURST_WRITE",
        "BURST_KEYED_WRITE",
        "BURST_LOGIN",
        "BURST_UPLOAD",
        "CONN_PER_IP",
        "CONN_PER_KEYED_IP",
        "CONN_UPLOAD",
        "CONN_SESSIONS_PER_IP",
        "HSTS_MAX_AGE",
    ):
        _check(key, raw[key], re.compile(r"^[0-9]+$"), "a whole number")
    if raw["WORKER_PROCESSES"] != "auto":
        _check("WORKER_PROCESSES", raw["WORKER_PROCESSES"], re.compile(r"^[1-9][0-9]*$"), "auto or a number")
    _check("REAL_IP_HEADER", raw["REAL_IP_HEADER"], _HEADER_RE, "a header name")
    for key in (
        "CLIENT_HEADER_TIMEOUT",
        "CLIENT_BODY_TIMEOUT",
        "SEND_TIMEOUT",
        "SESSION_READ_TIMEOUT",
        "SESSION_SEND_TIMEOUT",
    ):
        _check(key, raw[key], _TIME_RE, "a duration like 10s")
    _check("SNDBUF", raw["SNDBUF"], _SIZE_RE, "a size like 131072 or 128k (0: autotuned)")
    for key in ("CSP", "DOCS_CSP"):
        # It lands inside "..." of a map value, where $ would be read as a variable.
        if re.search(r'["\\$\n{}]', raw[key]) or not raw[key].strip():
            raise NginxConfigError(
                f"TTS_NGINX_{key} must be a policy without quotes, backslashes, $ or braces"
            )
    return raw


def _shared_limits(env: Mapping[str, str]) -> dict[str, str]:
    """Body sizes, timeouts and the X-Accel prefix: from the variables Django reads (webapp/settings.py)."""
    body = _env_int(env, "TTS_MAX_BODY_BYTES", 1024 * 1024)
    upload = _env_int(env, "TTS_MAX_UPLOAD_BYTES", 20 * 1024 * 1024)
    client_max_body = env.get("TTS_NGINX_CLIENT_MAX_BODY") or str(body)
    _check("CLIENT_MAX_BODY", client_max_body, _SIZE_RE, "a size like 1048576, 512k or 1m")
    long_poll = _env_int(env, "TTS_LONG_POLL_MAX_SECONDS", 30)
    openai_wait = _env_int(env, "TTS_OPENAI_WAIT_SECONDS", 120)
    read_timeout = env.get("TTS_NGINX_PROXY_READ_TIMEOUT") or f"{long_poll + TIMEOUT_MARGIN_SECONDS}s"
    openai_timeout = env.get("TTS_NGINX_OPENAI_READ_TIMEOUT") or f"{openai_wait + TIMEOUT_MARGIN_SECONDS}s"
    _check("PROXY_READ_TIMEOUT", read_timeout, _TIME_RE, "a duration like 45s")
    _check("OPENAI_READ_TIMEOUT", openai_timeout, _TIME_RE, "a duration like 135s")
    # Nginx's own decoder_busy says to come back when Django's would (webapp/speech/services/decodes.py).
    decode_wait = math.ceil(_env_float(env, "TTS_PROMPT_DECODE_WAIT_SECONDS", 10.0))
    accel = env.get("TTS_ACCEL_REDIRECT_PREFIX") or "/_protected/media/"
    if not re.match(r"^/[A-Za-z0-9_/.-]*/$", accel) or ".." in accel:
        raise NginxConfigError(f"TTS_ACCEL_REDIRECT_PREFIX={accel!r} must be a path like /_protected/media/")
    return {
        "CLIENT_MAX_BODY": client_max_body,
        "UPLOAD_MAX_BODY": str(upload + MULTIPART_SLACK_BYTES),
        "PROXY_READ_TIMEOUT": read_timeout,
        "OPENAI_READ_TIMEOUT": openai_timeout,
        "ACCEL_PREFIX": accel,
        "RETRY_UPLOAD_BUSY": str(max(1, decode_wait)),
    }


def _tls_values(cfg: StackConfig, env: Mapping[str, str]) -> dict[str, str]:
    if env.get("TTS_TLS_CERT") and env.get("TTS_TLS_KEY"):
        cert, tls_key = Path(env["TTS_TLS_CERT"]), Path(env["TTS_TLS_KEY"])
    else:
        cert, tls_key = ensure_certificate(cfg)
    dhparam = ensure_dhparam(Path(env.get("TTS_TLS_DHPARAM") or str(cfg.path("tls", "dhparam.pem"))))
    return {"TLS_CERT": str(cert), "TLS_KEY": str(tls_key), "TLS_DHPARAM": str(dhparam)}


def _user_line() -> str:
    """As root, Nginx's workers run as nobody in the app user's group (the socket and audio are 0660/0640)."""
    return f"user nobody {APP_SYSTEM_USER};" if app_user() is not None else ""


def nginx_values(
    cfg: StackConfig, env: Mapping[str, str] | None = None, name: str = "nginx"
) -> dict[str, str]:
    """Every placeholder's value for the instance ``name`` (its files live in var/<name>/)."""
    env = os.environ if env is None else env
    raw = _checked_settings(env)
    listen = raw["LISTEN"].strip()
    if listen and not listen.endswith(":"):
        listen += ":"  # "127.0.0.1" -> "127.0.0.1:" in front of the port
    out_dir = cfg.path(name)
    limits = {
        key: raw[key]
        for key in (
            "CONN_PER_IP",
            "CONN_PER_KEYED_IP",
            "CONN_UPLOAD",
            "CONN_SESSIONS_PER_IP",
            "SESSION_READ_TIMEOUT",
            "SESSION_SEND_TIMEOUT",
            "CSP",
            "DOCS_CSP",
            "WORKER_PROCESSES",
            "CLIENT_HEADER_TIMEOUT",
            "CLIENT_BODY_TIMEOUT",
            "SEND_TIMEOUT",
        )
    }
    for zone in ("GENERAL", "KEYED_GENERAL", "WRITE", "KEYED_WRITE", "LOGIN", "UPLOAD"):
        limits[f"RATE_{zone}"] = raw[f"RATE_{zone}"]
        limits[f"BURST_{zone}"] = raw[f"BURST_{zone}"]
        limits[f"RETRY_{zone}"] = str(retry_after_seconds(raw[f"RATE_{zone}"]))
    return {
        **limits,
        **_shared_limits(env),
        **_tls_values(cfg, env),
        "HSTS_VALUE": f"max-age={raw['HSTS_MAX_AGE']}; includeSubDomains",
        "USER_LINE": _user_line(),
        "REAL_IP_BLOCK": _real_ip_block(raw["REAL_IP_FROM"], raw["REAL_IP_HEADER"]),
        "HTTP_PORT": str(cfg.http_port),
        "HTTPS_PORT": str(cfg.https_port),
        "HTTPS_PORT_SUFFIX": "" if cfg.https_port == 443 else f":{cfg.https_port}",
        "LISTEN_ADDR": listen,
        "SNDBUF_OPTION": "" if raw["SNDBUF"] in ("0", "0k", "0m") else f" sndbuf={raw['SNDBUF']}",
        "NGINX_DIR": str(out_dir),
        # Both go to the supervisor, which writes var/log/<name>.log rotated by size
        # like every other process (Nginx cannot rotate its own files by size).
        "ACCESS_LOG": "/dev/stdout",
        # The same folders deploy.provision.StackConfig.django_env() gives Django.
        "STATIC_ROOT": str(cfg.path("static")),
        "MEDIA_ROOT": str(cfg.path("media")),
        "UPSTREAM": f"unix:{cfg.gunicorn_socket}",
        "SNIPPETS": str(out_dir / "snippets"),
        "PROBLEM_BASE": PROBLEM_BASE,
        "METRICS_ALLOW": metrics_allow(env.get("TTS_METRICS_ALLOWED_IPS") or "127.0.0.1,::1"),
        "ADMIN_ALLOW": allow_lines(
            "TTS_ADMIN_ALLOW_CIDRS", env.get("TTS_ADMIN_ALLOW_CIDRS") or "127.0.0.1,::1"
        ),
        "SERVER_NAMES": server_names(env_list("DJANGO_ALLOWED_HOSTS", ALLOWED_HOSTS_DEFAULT, env)),
    }


def render(template: str, values: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"nginx template placeholder {{{{{key}}}}} has no value")
        return values[key]

    return re.sub(r"\{\{([A-Z_]+)\}\}", sub, template)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_nginx_conf(
    cfg: StackConfig,
    env: Mapping[str, str] | None = None,
    name: str = "nginx",
    overrides: Mapping[str, str] | None = None,
) -> Path:
    """Write var/<name>/nginx.conf and its snippets; returns the config path.

    ``name`` lets tests run extra instances (other settings, other ports) next
    to the main one; ``overrides`` replaces computed values (e.g. UPSTREAM).
    """
    values = nginx_values(cfg, env, name)
    values.update(overrides or {})
    out_dir = Path(values["NGINX_DIR"])
    for sub in ("snippets", "tmp", "tmp/client_body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and sub.startswith("tmp"):
            # Nginx's workers run as nobody and write request bodies here: theirs alone.
            nobody = pwd.getpwnam("nobody")
            os.chown(out_dir / sub, nobody.pw_uid, nobody.pw_gid)
            os.chmod(out_dir / sub, 0o700)
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    for snippet in sorted(SNIPPET_DIR.glob("*.conf")):
        _write(out_dir / "snippets" / snippet.name, render(snippet.read_text(), values))
    conf = out_dir / "nginx.conf"
    _write(conf, render((TEMPLATE_DIR / "nginx.conf.template").read_text(), values))
    return conf


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def check_config(conf: Path) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on a rendered config (output in .stdout)."""
    return subprocess.run(
        [nginx_binary(), "-t", "-c", str(conf), "-p", str(conf.parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def nginx_command(cfg: StackConfig) -> list[str]:
    """The Nginx of the stack, in the foreground (the supervisor owns it), on its rendered config."""
    conf = render_nginx_conf(cfg)
    return [nginx_binary(), "-c", str(conf), "-p", str(cfg.path("nginx")), "-g", "daemon off;"]
