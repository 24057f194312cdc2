"""ASGI entry point, served by gunicorn with uvicorn workers (deploy/gunicorn.conf.py).

/healthz is answered before Django's handler (webapp/health.py says why).

Under ASGI the waiting views (long-poll, /v1/audio/speech) wait as coroutines
on Redis notifications, so a waiting client holds no thread; the sync views
run in a thread of their own per request (Django's thread-sensitive mode).
"""

import logging
import os
from typing import Any

from django.core.asgi import get_asgi_application

from webapp.provisioning import check_ready_to_serve

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Each request's sync code runs in a thread that ends with the request, so a
# connection kept per thread would outlive its only user (Django advises no
# persistent connections under ASGI): connections come from a per-process
# pool instead, and closing one gives it back. Only here: a pool created in
# a Celery parent would be shared by its forked children.
os.environ.setdefault("DATABASE_POOL_SIZE", "20")

django_application = get_asgi_application()
# No serving without the secrets: the error names the variable and `manage.py prepare_var`.
check_ready_to_serve()

from webapp.health import answered_first  # noqa: E402 -- imports Django's parts: after its setup
from webapp.private_apis import check_all  # noqa: E402
from webapp.speech.api.sockets import session_app  # noqa: E402

# Each private name of a library the site relies on, checked now that logging is set up:
# a missing one is logged with the library's version, and its code falls back (webapp/private_apis.py).
check_all()


async def _by_scope_type(scope: Any, receive: Any, send: Any) -> None:
    """WebSockets (realtime sessions) to their own ASGI app; HTTP and lifespan to Django's."""
    if scope["type"] == "websocket":
        await session_app(scope, receive, send)
        return
    await django_application(scope, receive, send)


application = answered_first(_by_scope_type)


def _warm_up() -> None:
    """Do in the worker's boot what the first requests would otherwise do while clients wait.

    Measured under the waiting benchmark: importing every view (the URLconf is
    imported on the first request), building reverse()'s table and opening the
    connection pool took 1-2 s of a fresh worker's CPU, and the first requests
    after each start or recycle waited that long. A database that is away is not an error here:
    requests report it as they would have.
    """
    from django.db import DatabaseError, connection
    from django.urls import get_resolver

    resolver = get_resolver()
    resolver.url_patterns  # noqa: B018 -- importing every view is the point
    resolver.reverse_dict  # noqa: B018 -- and building reverse()'s table (0.3 s), once
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        logging.getLogger(__name__).warning("warm-up: database not reachable yet: %s", exc)
    finally:
        connection.close()  # back to the pool; this thread serves no request


_warm_up()
