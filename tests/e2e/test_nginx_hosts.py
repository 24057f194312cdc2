"""Only the names the site serves reach Django; the admin only from the operators' addresses."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from deploy import nginx as deploy_nginx
from tests.e2e.nginx_helpers import client
from tests.stack import CFG


def test_a_host_it_does_not_serve_gets_421_and_never_a_setting(web: Any) -> None:
    password = CFG.redis_password
    for path in ("/", "/no-such-page/", "/api/v1/no-such-thing", "/healthz"):
        response = client().get(
            f"https://127.0.0.1:{CFG.https_port}{path}", headers={"Host": "x"}, timeout=20
        )
        assert response.status_code == 421, (path, response.status_code)
        assert password not in response.text and "redis://" not in response.text
    plain = client().get(f"http://127.0.0.1:{CFG.http_port}/", headers={"Host": "x"}, allow_redirects=False)
    assert plain.status_code == 421


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_the_names_it_serves_reach_django(web: Any, host: str) -> None:
    response = client().get(f"https://127.0.0.1:{CFG.https_port}/healthz", headers={"Host": host}, timeout=20)
    assert response.status_code in (200, 503)  # Django answered (503: no worker in this test)
    assert response.headers["Content-Type"].startswith("application/json")


def test_the_admin_answers_only_the_operators_addresses(web: Any) -> None:
    url = f"https://127.0.0.1:{CFG.https_port}/admin/login/"
    assert client("127.0.0.8").get(url, timeout=20).status_code == 403
    assert client().get(url, timeout=20).status_code == 200


def test_server_names_follow_allowed_hosts() -> None:
    assert deploy_nginx.server_names(["localhost", ".example.com", "[::1]"]) == "localhost .example.com [::1]"
    assert deploy_nginx.server_names(["*"]) == "~."
    with pytest.raises(deploy_nginx.NginxConfigError, match="DJANGO_ALLOWED_HOSTS"):
        deploy_nginx.server_names(["tts.example.com;", "x"])


def test_a_bad_admin_cidr_is_a_clear_error() -> None:
    cfg = dataclasses.replace(CFG, http_port=18080, https_port=18443)
    with pytest.raises(deploy_nginx.NginxConfigError, match="TTS_ADMIN_ALLOW_CIDRS"):
        deploy_nginx.render_nginx_conf(
            cfg, env={**os.environ, "TTS_ADMIN_ALLOW_CIDRS": "office"}, name="nginx-check-admin"
        )
