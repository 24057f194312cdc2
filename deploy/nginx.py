"""Render nginx/nginx.conf.template into var/nginx/nginx.conf.

Placeholders look like ``{{NAME}}`` (Nginx itself uses ``$name``). Values come
from the stack config and TTS_NGINX_* environment variables (README table).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploy.stack import StackConfig

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "nginx"

DEFAULTS = {
    "RATE_GENERAL": "20r/s",
    "BURST_GENERAL": "40",
    "RATE_WRITE": "2r/s",
    "BURST_WRITE": "5",
    "RATE_LOGIN": "10r/m",
    "BURST_LOGIN": "5",
    "CONN_PER_IP": "50",
    "CLIENT_MAX_BODY": "1m",
    "PROXY_READ_TIMEOUT": "150s",
}


def nginx_values(cfg: StackConfig) -> dict[str, str]:
    from deploy.stack import ensure_certificate

    cert, key = ensure_certificate(cfg)
    values = {name: os.environ.get(f"TTS_NGINX_{name}", default) for name, default in DEFAULTS.items()}
    upload = int(os.environ.get("TTS_MAX_UPLOAD_BYTES", str(20 * 1024 * 1024)))
    values.update(
        {
            "HTTP_PORT": str(cfg.http_port),
            "HTTPS_PORT": str(cfg.https_port),
            "LISTEN_ADDR": os.environ.get("TTS_NGINX_LISTEN", ""),
            "VAR_DIR": str(cfg.var_dir),
            "STATIC_ROOT": str(cfg.path("static")),
            "MEDIA_ROOT": os.environ.get("TTS_MEDIA_ROOT", str(cfg.path("media"))),
            "LOG_DIR": str(cfg.log_dir),
            "GUNICORN_SOCKET": str(cfg.gunicorn_socket),
            "TLS_CERT": str(cert),
            "TLS_KEY": str(key),
            "UPLOAD_MAX_BODY": str(upload),
            "SNIPPETS": str(TEMPLATE_DIR / "snippets"),
            "USER": "nobody nogroup" if os.geteuid() == 0 else "",
            "REAL_IP": os.environ.get("TTS_NGINX_REAL_IP_FROM", ""),
        }
    )
    return values


def render(template: str, values: dict[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"nginx template placeholder {{{{{name}}}}} has no value")
        return values[name]

    return re.sub(r"\{\{([A-Z_]+)\}\}", sub, template)


def render_nginx_conf(cfg: StackConfig) -> Path:
    values = nginx_values(cfg)
    out_dir = cfg.path("nginx")
    for sub in ("tmp", "tmp/client_body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chmod(out_dir / sub, 0o777)
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    text = render((TEMPLATE_DIR / "nginx.conf.template").read_text(), values)
    if values["USER"]:
        text = "user " + values["USER"] + ";\n" + text
    if values["REAL_IP"]:
        # Behind a load balancer: trust its X-Forwarded-For, only from these addresses.
        real_ip = "".join(f"    set_real_ip_from {cidr.strip()};\n" for cidr in values["REAL_IP"].split(","))
        real_ip += "    real_ip_header X-Forwarded-For;\n    real_ip_recursive on;\n"
        text = text.replace("    # {{REAL_IP_BLOCK}}\n", real_ip)
    else:
        text = text.replace("    # {{REAL_IP_BLOCK}}\n", "")
    conf = out_dir / "nginx.conf"
    tmp = conf.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, conf)
    return conf
