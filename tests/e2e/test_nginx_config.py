"""The rendered Nginx configuration: `nginx -t`, the TLS line, the error mapping, the settings."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import nginx as deploy_nginx
from tests.stack import CFG

# The realtime sessions' location: the native path and the agents' dialects.
SESSION_LOCATION = "location ~ ^/v1/(audio/speech/stream|speak|text-to-speech/[^/]+/(multi-)?stream-input)$ {"


def _render(name: str, **env: str) -> Path:
    cfg = dataclasses.replace(CFG, http_port=18080, https_port=18443)
    return deploy_nginx.render_nginx_conf(cfg, env={**os.environ, **env}, name=name)


def _full_text(conf: Path) -> str:
    """The config with its snippets, as Nginx reads it."""
    parts = [conf.read_text()]
    parts += [p.read_text() for p in sorted((conf.parent / "snippets").glob("*.conf"))]
    return "\n".join(parts)


def test_nginx_t_accepts_the_rendered_config() -> None:
    conf = _render("nginx-check")
    result = deploy_nginx.check_config(conf)
    assert result.returncode == 0, result.stdout
    assert "test is successful" in result.stdout
    # Every placeholder was filled, in the config and in the snippets.
    assert "{{" not in _full_text(conf)


def test_tls_protocols_are_exactly_1_2_and_1_3() -> None:
    text = _render("nginx-check").read_text()
    lines = re.findall(r"^\s*ssl_protocols\s+([^;]*);", text, re.M)
    assert lines == ["TLSv1.2 TLSv1.3"]


def test_api_and_openai_locations_map_nginx_errors_to_json() -> None:
    conf = _render("nginx-check")
    snippets = conf.parent / "snippets"
    api = (snippets / "api_errors.conf").read_text()
    openai = (snippets / "openai_errors.conf").read_text()
    for code in (413, 429, 500, 502, 503, 504):
        assert f"error_page {code} @api_{code};" in api
        assert f"error_page {code} @openai_{code};" in openai
    locations = (snippets / "error_locations.conf").read_text()
    # The six codes, and the upload locations' own 503 (decoder_busy: TTS_NGINX_CONN_UPLOAD).
    assert locations.count("default_type application/problem+json;") == 7
    assert locations.count("Retry-After $tts_retry_after always;") == 3  # api, openai, html 429
    text = conf.read_text()
    # Each API location includes the right mapping (the prefix and the strict ones; the dashboard's
    # consent recording, whose script reads problem+json; OpenAI's consent path and session socket).
    assert text.count("snippets/api_errors.conf;") == 4
    assert text.count("snippets/openai_errors.conf;") == 4
    assert "error_page 503 @openai_uploads_busy;" in text


def test_rates_sizes_and_timeouts_come_from_settings() -> None:
    conf = _render(
        "nginx-check-settings",
        TTS_NGINX_RATE_WRITE="3r/m",
        TTS_NGINX_BURST_WRITE="7",
        TTS_MAX_UPLOAD_BYTES="5000000",
        TTS_MAX_BODY_BYTES="65536",
        TTS_OPENAI_WAIT_SECONDS="40",
        TTS_LONG_POLL_MAX_SECONDS="10",
    )
    text = conf.read_text()
    assert "zone=write:10m rate=3r/m;" in text
    assert text.count("limit_req zone=write burst=7 nodelay;") == 5  # the session handshake too
    # Retry-After for the strict zone is one leak interval: 60 s / 3.
    assert re.search(r'"~\^POST /api/v1/\(speech\|voices\)/\?\$"\s+20;', text)
    assert "client_max_body_size 65536;" in text
    assert f"client_max_body_size {5000000 + deploy_nginx.MULTIPART_SLACK_BYTES};" in text
    assert "proxy_read_timeout 55s;" in text  # OpenAI wait 40 s + margin
    assert "proxy_read_timeout 25s;" in text  # long poll 10 s + margin
    assert deploy_nginx.check_config(conf).returncode == 0


def test_the_session_socket_location_takes_its_settings() -> None:
    conf = _render(
        "nginx-check-sessions",
        TTS_NGINX_SESSION_READ_TIMEOUT="900s",
        TTS_NGINX_SESSION_SEND_TIMEOUT="45s",
        TTS_NGINX_CONN_SESSIONS_PER_IP="7",
    )
    text = conf.read_text()
    location = text.split(SESSION_LOCATION, 1)[1].split("}", 1)[0]
    assert "snippets/proxy.conf;" in location and "snippets/websocket.conf;" in location
    assert "limit_req zone=keyed_write" in location and "limit_req zone=write" in location
    websocket = (conf.parent / "snippets" / "websocket.conf").read_text()
    for line in (
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $connection_upgrade;",
        "proxy_read_timeout 900s;",
        "proxy_send_timeout 45s;",
        "proxy_buffering off;",
        "limit_conn sessions 7;",
    ):
        assert line in websocket
    assert "TEMPORARY" not in text
    assert '"uri":"$tts_logged_uri"' in text and "$request_uri," not in text.split("log_format", 1)[1][:800]
    assert deploy_nginx.check_config(conf).returncode == 0


def test_real_ip_mode_trusts_only_the_listed_balancers() -> None:
    plain = _render("nginx-check").read_text()
    assert "set_real_ip_from" not in plain
    conf = _render("nginx-check-realip", TTS_NGINX_REAL_IP_FROM="10.0.0.0/8, 127.0.0.2")
    text = conf.read_text()
    assert "set_real_ip_from 10.0.0.0/8;" in text
    assert "set_real_ip_from 127.0.0.2;" in text
    assert "real_ip_header X-Forwarded-For;" in text
    assert deploy_nginx.check_config(conf).returncode == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TTS_NGINX_RATE_WRITE": "fast"}, "TTS_NGINX_RATE_WRITE"),
        ({"TTS_NGINX_BURST_GENERAL": "-1"}, "TTS_NGINX_BURST_GENERAL"),
        ({"TTS_NGINX_REAL_IP_FROM": "balancer.local"}, "TTS_NGINX_REAL_IP_FROM"),
        ({"TTS_NGINX_PROXY_READ_TIMEOUT": "1 s; evil"}, "TTS_NGINX_PROXY_READ_TIMEOUT"),
        ({"TTS_NGINX_SESSION_READ_TIMEOUT": "1h; evil"}, "TTS_NGINX_SESSION_READ_TIMEOUT"),
        ({"TTS_NGINX_CONN_SESSIONS_PER_IP": "many"}, "TTS_NGINX_CONN_SESSIONS_PER_IP"),
        ({"TTS_MAX_UPLOAD_BYTES": "20MB"}, "TTS_MAX_UPLOAD_BYTES"),
        ({"TTS_NGINX_CSP": "default-src 'self'\" always; add_header X-Evil \"1"}, "TTS_NGINX_CSP"),
    ],
)
def test_a_bad_setting_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(deploy_nginx.NginxConfigError, match=message):
        _render("nginx-check-bad", **env)


def test_retry_after_is_one_leak_interval() -> None:
    assert deploy_nginx.retry_after_seconds("2r/s") == 1
    assert deploy_nginx.retry_after_seconds("10r/m") == 6
    assert deploy_nginx.retry_after_seconds("7r/m") == 9


def test_the_kubernetes_edge_renders_the_session_location_and_a_bounded_graceful_quit(tmp_path: Path) -> None:
    """The edge image's entry point (deploy/container/edge.py, run as the image runs it, with
    --check) renders the same template: the session socket's location and settings, and a
    worker_shutdown_timeout that fits in the edge pod's grace period (validate_k8s checks the sum)."""
    from deploy.provision import ensure_certificate
    from deploy.validate_k8s import nginx_shutdown_timeout

    cert, key = ensure_certificate(CFG)
    env = {
        **os.environ,
        "TTS_VAR_DIR": str(tmp_path),
        "TTS_EDGE_UPSTREAM": "127.0.0.1:8000",
        "TTS_TLS_CERT": str(cert),
        "TTS_TLS_KEY": str(key),
        "TTS_TLS_DHPARAM": str(tmp_path / "dhparam.pem"),
        "TTS_NGINX_SESSION_READ_TIMEOUT": "600s",
    }
    entry = Path(deploy_nginx.__file__).parent / "container" / "edge.py"
    result = subprocess.run(
        [sys.executable, str(entry), "--check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "test is successful" in result.stderr, result.stderr
    conf = next(tmp_path.rglob("nginx.conf"))
    text = conf.read_text()
    assert "server 127.0.0.1:8000" in text
    assert f"worker_shutdown_timeout {nginx_shutdown_timeout()}s;" in text
    location = text.split(SESSION_LOCATION, 1)[1].split("}", 1)[0]
    assert "snippets/websocket.conf;" in location
    websocket = (conf.parent / "snippets" / "websocket.conf").read_text()
    assert "proxy_set_header Upgrade $http_upgrade;" in websocket and "proxy_read_timeout 600s;" in websocket
