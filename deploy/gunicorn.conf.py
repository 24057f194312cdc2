"""gunicorn's settings for the web tier: the one file the local stack and tts-web.service use.

``gunicorn -c deploy/gunicorn.conf.py webapp.wsgi:application``; each caller adds
only where to bind (and the local stack, as root, the group Nginx shares the
socket with). Values come from the environment through webapp/env.py, like
every other setting (README, settings table).
"""

from webapp.env import env_int

worker_class = "gthread"
workers = env_int("TTS_GUNICORN_WORKERS", 2)
threads = env_int("TTS_GUNICORN_THREADS", 16)
# Longer than the synchronous OpenAI endpoint waits (TTS_OPENAI_WAIT_SECONDS).
timeout = env_int("TTS_GUNICORN_TIMEOUT", 180)
graceful_timeout = 20
# The socket is for Nginx (same user or shared group) only: never world-writable.
umask = 0o007
accesslog = "-"
