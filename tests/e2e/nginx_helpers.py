"""Shared pieces of the tests/e2e/test_nginx_*.py modules.

Clients with a chosen loopback source address (Nginx keys its limits on the
peer address, so 127.0.0.1 and 127.0.0.2 are two different clients), and extra
Nginx instances rendered from the same template with other settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter

from deploy import nginx as deploy_nginx
from deploy.stack import Service, StackConfig, ensure_certificate
from tests.stack import CFG, TestStack, spare_port

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

PROBLEM_JSON = "application/problem+json"
HSTS = "max-age=31536000; includeSubDomains"


class SourceAddressAdapter(HTTPAdapter):
    """Connect from a given local address, so Nginx sees that address as $remote_addr."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def client(source: str = "127.0.0.1") -> requests.Session:
    session = requests.Session()
    # REQUESTS_CA_BUNDLE / proxy variables of the machine must not replace our settings.
    session.trust_env = False
    adapter = SourceAddressAdapter(source)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    cert = CFG.path("tls", "cert.pem")
    # The test certificate names 127.0.0.1, 127.0.0.2 and localhost.
    session.verify = str(cert) if cert.exists() else False
    return session


@dataclasses.dataclass
class NginxInstance:
    name: str
    cfg: StackConfig
    conf: Path
    service: Service

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.cfg.https_port}"

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.cfg.https_port}{path}"

    @property
    def access_log(self) -> Path:
        # The supervisor's log of this Nginx: JSON access lines mixed with error-log lines.
        return self.cfg.log_dir / f"{self.name}.log"

    def log_entries(self) -> list[dict[str, Any]]:
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.startswith("{")]


def start_nginx(
    stack: TestStack,
    name: str,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
    cfg: StackConfig | None = None,
) -> NginxInstance:
    """One more Nginx from the project template, on free ports, with its own zones and logs.

    By default it proxies to the test stack's gunicorn socket (the `web` fixture's).
    """
    base = cfg or CFG
    inst_cfg = dataclasses.replace(base, http_port=spare_port(), https_port=spare_port())
    full_env = {
        **os.environ,
        "TTS_TLS_CERT": str(CFG.path("tls", "cert.pem")),
        "TTS_TLS_KEY": str(CFG.path("tls", "key.pem")),
        **(env or {}),
    }
    ensure_certificate(CFG)
    conf = deploy_nginx.render_nginx_conf(inst_cfg, env=full_env, name=name, overrides=overrides)
    log = inst_cfg.log_dir / f"{name}.log"
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    command = [deploy_nginx.nginx_binary(), "-c", str(conf), "-p", str(conf.parent), "-g", "daemon off;"]
    service = stack.start_service(Service(name, command, ready_port=inst_cfg.https_port), timeout=20)
    return NginxInstance(name, inst_cfg, conf, service)


def wait_for_log(
    instance: NginxInstance, predicate: Any, count: int = 1, timeout: float = 5
) -> list[dict[str, Any]]:
    """Access-log lines are written after the response is sent; wait until `count` wanted ones are there."""
    deadline = time.monotonic() + timeout
    while True:
        entries = [e for e in instance.log_entries() if predicate(e)]
        if len(entries) >= count or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def openssl_connect(port: int, *args: str, host: str = "127.0.0.1") -> subprocess.CompletedProcess[str]:
    """A TLS handshake with `openssl s_client` (stdin closed, so it ends right after)."""
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"{host}:{port}", "-servername", "localhost", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=20,
    )
