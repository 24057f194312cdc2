"""With DJANGO_DEBUG=1, Django's debug pages go to loopback clients only.

A debug page lists settings (Redis URLs with their password), paths and every
URL pattern. During development on this machine that helps; a page answered
to anyone else is replaced by the plain template (webapp/templates/<code>.html),
as with DEBUG off. Django writes its debug pages as HTML, or as plain text to a
client that does not take HTML (``Accept: text/plain``, curl's ``*/*`` aside):
both are replaced. The API's problem+json errors are not debug pages and pass.
Installed first in MIDDLEWARE only when DEBUG is on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template import loader

from webapp.audit.context import client_ip

PLAIN_PAGES = (400, 403, 404, 500)


# What Django's debug pages are written as (technical_404_response, technical_500_response).
DEBUG_PAGE_TYPES = ("text/html", "text/plain")


def is_loopback(request: HttpRequest) -> bool:
    address = client_ip(request)
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:  # not an address: not this machine
        return False


class LoopbackDebugPagesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        debug_type = response.get("Content-Type", "").startswith(DEBUG_PAGE_TYPES)
        if settings.DEBUG and response.status_code in PLAIN_PAGES and debug_type and not is_loopback(request):
            page = loader.get_template(f"{response.status_code}.html").render()
            return HttpResponse(page, status=response.status_code)
        return response
