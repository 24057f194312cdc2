"""Test settings: the webapp settings pointed at the test stack (var/test, other ports).

Tests never touch the data of `make run`.
"""

import os

from deploy.stack import StackConfig

TEST_STACK = StackConfig.for_tests()
os.environ.update(TEST_STACK.django_env())
os.environ["TTS_FAST_PASSWORD_HASHER"] = "1"
os.environ.setdefault("TTS_LOG_TO_FILE", "0")
os.environ.setdefault("TTS_CACHE_PREFIX", "tts-test")

from webapp.settings import *  # noqa: E402,F403

EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
