"""gunicorn's settings for the web tier: the one file the local stack and tts-web.service use.

``gunicorn -c deploy/gunicorn.conf.py``; each caller adds only where to bind
(and the local stack, as root, the group Nginx shares the socket with). Values
come from the environment through webapp/env.py, like every other setting
(README, settings table).
"""

from webapp.env import env_int

# ASGI under uvicorn workers: a client waiting on a job (long-poll,
# /v1/audio/speech) holds a coroutine, not a thread (webapp/asgi.py).
wsgi_app = "webapp.asgi:application"
# uvicorn's worker with small per-connection write buffers (deploy/asgi_worker.py: what a stream charges).
worker_class = "deploy.asgi_worker.Worker"
workers = env_int("TTS_GUNICORN_WORKERS", 2)
# Worker heartbeat timeout: a worker whose event loop is blocked this long is replaced.
timeout = env_int("TTS_GUNICORN_TIMEOUT", 180)
graceful_timeout = 20
# The socket is for Nginx (same user or shared group) only: never world-writable.
umask = 0o007
accesslog = "-"


# Prometheus multiprocess mode (webapp/metrics/multiproc.py): one emptied folder
# per start, set in the master before any worker imports prometheus-client.
def on_starting(server: object) -> None:
    import os

    from webapp.metrics import multiproc

    folder = multiproc.prepare()
    cfg = getattr(server, "cfg", None)
    if os.geteuid() == 0 and cfg is not None and cfg.uid != 0:
        os.chown(folder, cfg.uid, cfg.gid)  # the workers run as the app user (--user)


def child_exit(server: object, worker: object) -> None:
    from webapp.metrics import multiproc

    multiproc.mark_dead(int(getattr(worker, "pid", 0)))


def when_ready(server: object) -> None:
    """The socket is read-write for its owner and Nginx's group only (0660)."""
    import os
    import socket

    for listener in getattr(server, "LISTENERS", []):
        if listener.FAMILY == socket.AF_UNIX:
            os.chmod(listener.cfg_addr, 0o660)


def post_worker_init(worker: object) -> None:
    """Each worker finds, as the user it runs as, what confines its voice-upload decode children:
    the log says which sandbox runs, and one the host cannot give stops the start."""
    from webapp.speech.services import prompts

    prompts.decode_sandbox()
