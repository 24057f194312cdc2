"""ASGI entry point: ``gunicorn -k uvicorn.workers.UvicornWorker webapp.asgi:application``.

Under ASGI the waiting views (long-poll, /v1/audio/speech) wait as coroutines
on Redis notifications, so a waiting client holds no thread; the sync views
run in Django's thread pool as before.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

application = get_asgi_application()
