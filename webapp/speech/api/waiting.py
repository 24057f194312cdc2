"""The API's waiting view: a DRF view whose handlers may return a ``Wait`` (services/waiting.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.http import HttpResponse
from django.http.response import HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from webapp.speech.services.waiting import Wait
from webapp.speech.submission import CONCURRENCY_HEADERS


def rate_headers(response: HttpResponseBase) -> dict[str, str]:
    """The RateLimit headers of a response, and a submit's concurrency headers."""
    return {
        k: v
        for k, v in response.items()
        if k.lower().startswith("ratelimit") or k.lower() in CONCURRENCY_HEADERS
    }


class WaitingAPIView(APIView):
    """A DRF view whose handlers may return a ``Wait``: the view's ``as_view()`` is then a ``prepare``.

    DRF's own ``dispatch`` runs (``initial()``: authentication, permissions,
    throttles; errors through ``handle_exception``); a ``Wait`` leaves it with
    the RateLimit headers DRF's ``finalize_response`` gives this request's answers.
    """

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(response, Wait):
            return super().finalize_response(request, response, *args, **kwargs)
        # An empty response to collect them on (DRF finalizes any HttpResponseBase; its stubs say Response).
        given = super().finalize_response(request, HttpResponse(), *args, **kwargs)  # type: ignore[arg-type]
        return replace(response, headers=rate_headers(given))
