"""The edge image's entry point: render our Nginx config from the environment, then run Nginx.

The same template, snippets and checks as ``make run`` (nginx/, deploy/nginx.py): TLS, the
per-IP ``limit_req`` and ``limit_conn`` zones, body limits and the internal X-Accel-Redirect
location, which serves audio from the media volume (``TTS_MEDIA_ROOT``, mounted read-only).
Three things differ from the local stack, each set here:

- the upstream is gunicorn over TCP (``TTS_EDGE_UPSTREAM``, default ``web:8000``, the web
  Service), not a Unix socket;
- static files are the ones collected into the image (``TTS_STATIC_ROOT``);
- the certificate is the mounted Secret (``TTS_TLS_CERT``/``TTS_TLS_KEY``) and the DH group the
  file baked at build (RFC 7919 ffdhe2048, public), so nothing is generated at start.

Written files go under ``$TTS_VAR_DIR/nginx`` (a writable volume); the root file system stays
read-only. The image has no Django: only the standard-library modules deploy/nginx.py uses.
"""

from __future__ import annotations

import os
import shutil
import sys
import types
from pathlib import Path

APP = Path(__file__).resolve().parents[2]


def _without_package_init() -> None:
    """Import webapp's standard-library modules without webapp/__init__.py, which loads Celery."""
    package = types.ModuleType("webapp")
    package.__path__ = [str(APP / "webapp")]
    sys.modules.setdefault("webapp", package)
    sys.path.insert(0, str(APP))


def render(env: dict[str, str]) -> Path:
    _without_package_init()
    from deploy import nginx  # after the stand-in package: deploy.nginx imports webapp.env
    from deploy.provision import StackConfig

    var_dir = Path(env.get("TTS_VAR_DIR", "/var/lib/tts"))
    cfg = StackConfig(
        var_dir=var_dir,
        pg_port=0,
        redis_port=0,
        http_port=int(env.get("TTS_HTTP_PORT", "8080")),
        https_port=int(env.get("TTS_HTTPS_PORT", "8443")),
        name="edge",
    )
    values = nginx.nginx_values(cfg, env, "nginx")
    values.update(
        {
            "UPSTREAM": env.get("TTS_EDGE_UPSTREAM", "web:8000"),
            "STATIC_ROOT": env.get("TTS_STATIC_ROOT", str(APP / "static")),
            "MEDIA_ROOT": env.get("TTS_MEDIA_ROOT", str(var_dir / "media")),
        }
    )
    template = (nginx.TEMPLATE_DIR / "nginx.conf.template").read_text()
    out = Path(values["NGINX_DIR"])
    for sub in ("snippets", "tmp/client_body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for snippet in sorted(nginx.SNIPPET_DIR.glob("*.conf")):
        (out / "snippets" / snippet.name).write_text(nginx.render(snippet.read_text(), values))
    conf = out / "nginx.conf"
    conf.write_text(nginx.render(template, values))
    return conf


def main(argv: list[str]) -> int:
    conf = render(dict(os.environ))
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    # -e: errors go to stderr from the start, not to /var/log/nginx (read-only here).
    command = [binary, "-e", "stderr", "-c", str(conf), "-p", str(conf.parent)]
    if argv[:1] == ["--check"]:
        os.execv(binary, [*command, "-t"])
    os.execv(binary, [*command, "-g", "daemon off;"])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
