"""ASGI entry point, served by gunicorn with uvicorn workers (deploy/gunicorn.conf.py).

Under ASGI the waiting views (long-poll, /v1/audio/speech) wait as coroutines
on Redis notifications, so a waiting client holds no thread; the sync views
run in a thread of their own per request (Django's thread-sensitive mode).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Each request's sync code runs in a thread that ends with the request, so a
# kept (persistent) connection would outlive its only user: Django advises
# CONN_MAX_AGE = 0 under ASGI. The waiting views' reads use the loop's
# thread pool, whose threads keep theirs (webapp/speech/api/waiting.py).
os.environ["DATABASE_CONN_MAX_AGE"] = "0"

application = get_asgi_application()
