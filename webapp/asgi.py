"""ASGI entry point, served by gunicorn with uvicorn workers (deploy/gunicorn.conf.py).

Under ASGI the waiting views (long-poll, /v1/audio/speech) wait as coroutines
on Redis notifications, so a waiting client holds no thread; the sync views
run in a thread of their own per request (Django's thread-sensitive mode).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Each request's sync code runs in a thread that ends with the request, so a
# connection kept per thread would outlive its only user (Django advises no
# persistent connections under ASGI): connections come from a per-process
# pool instead, and closing one gives it back. Only here: a pool created in
# a Celery parent would be shared by its forked children.
os.environ.setdefault("DATABASE_POOL_SIZE", "20")

application = get_asgi_application()
