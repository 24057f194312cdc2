"""Job history pages: DRF's cursor pagination, with our parameter names and errors.

The cursor stays opaque (DRF encodes the position; clients only follow
``next``); a cursor this API did not give out is a 400 ``invalid_cursor``, a
``limit`` out of range a 400 ``invalid_limit``, never a silent clamp.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.speech.api.params import int_param

DEFAULT_PAGE = 20
MAX_PAGE = 100


class JobCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = DEFAULT_PAGE
    page_size_query_param = "limit"
    max_page_size = MAX_PAGE

    def get_page_size(self, request: Request) -> int:
        return int_param(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None:
                # Our cursors only go forward and always carry a position; DRF checks
                # the shape, not the position, and a forged one must not reach the query.
                dt.datetime.fromisoformat(str(cursor.position or ""))
            return cursor
        except (NotFound, ValueError):
            raise DomainError(
                ErrorCode.INVALID_CURSOR, "The cursor is not one this API gave out.", field="cursor"
            ) from None

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"results": data, "next": self.get_next_link()})
