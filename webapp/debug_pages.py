"""With DJANGO_DEBUG=1, Django's debug pages go to loopback clients only.

A debug page lists settings (Redis URLs with their password), paths and every
URL pattern. During development on this machine that helps; a page answered
to anyone else is replaced by the plain template (webapp/templates/<code>.html),
as with DEBUG off. Installed first in MIDDLEWARE only when DEBUG is on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.template import loader

from webapp.audit.context import client_ip

PLAIN_PAGES = (400, 403, 404, 500)


def is_loopback(request: HttpRequest) -> bool:
    address = client_ip(request)
    return address is not None and ipaddress.ip_address(address).is_loopback


class LoopbackDebugPagesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        html = response.get("Content-Type", "").startswith("text/html")
        if response.status_code in PLAIN_PAGES and html and not is_loopback(request):
            page = loader.get_template(f"{response.status_code}.html").render()
            return HttpResponse(page, status=response.status_code)
        return response
