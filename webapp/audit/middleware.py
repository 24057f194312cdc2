"""The request context middleware: names each request, and audits admin writes it made."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from webapp.audit.context import HEADER, bind, client_ip, request_id_from, unbind
from webapp.audit.services import record_admin_write


class RequestContextMiddleware:
    """First in the chain: every later log line of the request names its id."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_from(request.headers.get(HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        token = bind(request_id, request=request, ip=client_ip(request))
        try:
            response = self.get_response(request)
            record_admin_write(request, response)
        finally:
            unbind(token)
        response[HEADER] = request_id
        return response
