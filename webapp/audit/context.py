"""One request id from Nginx to the worker: the request context and where it is bound.

Nginx sets ``X-Request-ID`` to its ``$request_id`` (the id of its access-log
line). :class:`RequestContextMiddleware` binds it (or a new one when the
request did not come through Nginx) for the request, answers it in an
``X-Request-Id`` header and remembers who asked from where, for the audit log.
The submit stores it on the job row, every Celery message sent while it is
bound carries it in a header, and the worker binds it again while it runs the
task and, after its claim, the claimed job's own id. Every log line shows the
bound id (:mod:`webapp.audit.logformat`).
"""

from __future__ import annotations

import contextvars
import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from webapp.client_ip import client_ip as header_ip

HEADER = "X-Request-Id"
CELERY_HEADER = "tts_request_id"
_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


@dataclass
class RequestContext:
    request_id: str
    request: Any = None  # the HttpRequest, whose user the audit log names
    ip: str | None = None
    job_id: str = ""
    audited: int = 0  # audit events recorded during this request


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("tts_request", default=None)


def current() -> RequestContext | None:
    return _current.get()


def current_request_id() -> str:
    ctx = _current.get()
    return ctx.request_id if ctx else ""


def new_request_id() -> str:
    return uuid.uuid4().hex


def valid_request_id(value: str | None) -> str | None:
    """An incoming id if it is one we may log and store as is; else None."""
    return value if value and _VALID.match(value) else None


def request_id_from(value: str | None) -> str:
    """The id an incoming X-Request-Id gives this request: its own if valid, else a new one."""
    return valid_request_id(value) or new_request_id()


def bind(request_id: str, **fields: Any) -> contextvars.Token[RequestContext | None]:
    return _current.set(RequestContext(request_id=request_id, **fields))


def unbind(token: contextvars.Token[RequestContext | None]) -> None:
    _current.reset(token)


def bind_job(job: Any) -> None:
    """In a worker, after a claim: log lines from here on name the claimed job and its request."""
    ctx = _current.get()
    request_id = getattr(job, "request_id", "") or (ctx.request_id if ctx else "")
    _current.set(RequestContext(request_id=request_id, job_id=str(job.id)))


def client_ip(request: HttpRequest) -> str | None:
    return valid_ip(header_ip(request))


def valid_ip(value: str | None) -> str | None:
    import ipaddress

    try:
        return str(ipaddress.ip_address((value or "").strip()))
    except ValueError:
        return None


# --------------------------------------------------------------------- Celery


def _add_header(headers: dict[str, Any] | None = None, **_: Any) -> None:
    request_id = current_request_id()
    if headers is not None and request_id and CELERY_HEADER not in headers:
        headers[CELERY_HEADER] = request_id


_task_tokens: dict[str, contextvars.Token[RequestContext | None]] = {}


def _task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    request_id = valid_request_id(getattr(task.request, CELERY_HEADER, None)) if task else None
    if task_id and request_id:
        _task_tokens[task_id] = bind(request_id)


def _task_finished(task_id: str | None = None, **_: Any) -> None:
    token = _task_tokens.pop(task_id or "", None)
    if token is not None:
        unbind(token)
    else:
        _current.set(None)  # a job bound after its claim must not name the next task's lines


def connect_celery_signals() -> None:
    from celery import signals

    signals.before_task_publish.connect(_add_header, weak=False)
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_finished, weak=False)
