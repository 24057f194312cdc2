"""Test settings: the webapp settings pointed at the test stack (var/test, other ports).

Tests never touch the data of `make run`.
"""

import os

from deploy.provision import StackConfig, prepare_var

TEST_STACK = StackConfig.for_tests()
# The suite provisions its own stack (var/test) before reading it, as `make run` does for
# var/: webapp.settings only reads the secrets, and their values are needed right here.
prepare_var(TEST_STACK)
os.environ.update(TEST_STACK.django_env())
os.environ["TTS_FAST_PASSWORD_HASHER"] = "1"
# The suite talks plain HTTP to Django's test client; production defaults are tested
# through `make run`'s stack (tests/e2e) and tests/integration/test_settings.py.
os.environ.setdefault("DJANGO_DEBUG", "1")
os.environ.setdefault("TTS_LOG_TO_FILE", "0")
os.environ.setdefault("TTS_CACHE_PREFIX", "tts-test")
# The admin's second factor is off in tests; tests/integration/test_operator_login.py turns it on.
os.environ.setdefault("TTS_ADMIN_REQUIRE_OTP", "0")
# Nginx serves hashed static names in tests as in production.
os.environ.setdefault("TTS_MANIFEST_STATIC", "1")
# The shared test Nginx must not rate-limit tests that submit many jobs from
# 127.0.0.1; the rate-limit tests start their own Nginx with strict rates.
os.environ.setdefault("TTS_NGINX_RATE_WRITE", "100r/s")
os.environ.setdefault("TTS_NGINX_BURST_WRITE", "200")
os.environ.setdefault("TTS_NGINX_RATE_GENERAL", "200r/s")
os.environ.setdefault("TTS_NGINX_BURST_GENERAL", "400")
# Tests send bad keys from 127.0.0.1 all session long: the per-address budget of failed
# authentications is off, except in the tests of it (tests/e2e/test_nginx_credentials.py).
os.environ.setdefault("TTS_AUTH_FAILURES_PER_IP", "0")
# The browser tests open the site at https://127.0.0.1:<port> (tests/e2e/dashboard_browser.py);
# the links in their mails must name the same host, or the browser's session cookie stays behind.
os.environ["TTS_PUBLIC_ORIGIN"] = f"https://127.0.0.1:{TEST_STACK.https_port}"
# Worker children of the test stack load the reliability tests' faults (each off unless
# its TTS_FAULT_* variable names a marker).
os.environ.setdefault("TTS_WORKER_HOOKS", "tests.faults")
# A waiter's lease lapses in 4 s (renewed every 1.3 s) where the default is 15: the test of a
# web process killed mid-wait sees the reaper end its job without waiting long.
os.environ.setdefault("TTS_WAITER_LEASE_SECONDS", "4")

from webapp.settings import *  # noqa: E402,F403

# In-process tests get Django's locmem backend from pytest-django anyway; the
# gunicorn of the test stack writes files (var/test/mail) the browser tests read.
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
