"""gunicorn's settings for the web tier: the one file the local stack and tts-web.service use.

``gunicorn -c deploy/gunicorn.conf.py webapp.asgi:application``; each caller adds
only where to bind (and the local stack, as root, the group Nginx shares the
socket with). Values come from the environment through webapp/env.py, like
every other setting (README, settings table).
"""

from webapp.env import env_int

# ASGI: a long-poll or /v1/audio/speech request waits as a coroutine, holding no
# thread (webapp/speech/api/waiting.py); sync views run in threads of their own.
worker_class = "uvicorn_worker.UvicornWorker"
workers = env_int("TTS_GUNICORN_WORKERS", 2)
# A worker that stops answering gunicorn's heartbeat this long is restarted
# (per worker, not per request: requests wait as long as their own limits say).
timeout = env_int("TTS_GUNICORN_TIMEOUT", 180)
graceful_timeout = 20
# The socket is for Nginx (same user or shared group) only: never world-writable.
umask = 0o007
accesslog = "-"
