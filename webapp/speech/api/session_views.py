"""``GET /api/v1/sessions``: the tenant's realtime sessions, each one history entry (its units are not
listed as jobs); ``GET /api/v1/sessions/{id}`` one of them. The sessions themselves run on the
WebSocket (webapp/speech/api/session_socket.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.speech.api.pagination import JobCursorPagination
from webapp.speech.api.views import TenantAPIView
from webapp.speech.models import SpeechSession
from webapp.speech.services.jobview import session_view

SESSION_SCHEMA = inline_serializer(
    "SpeechSession",
    {
        "id": serializers.UUIDField(),
        "object": serializers.CharField(),
        "protocol": serializers.CharField(),
        "status": serializers.ChoiceField(choices=SpeechSession.Status.values),
        "voice": serializers.CharField(),
        "format": serializers.CharField(),
        "contexts": serializers.IntegerField(),
        "units": serializers.IntegerField(),
        "received_characters": serializers.IntegerField(),
        "charged_characters": serializers.IntegerField(),
        "audio_seconds": serializers.FloatField(),
        "close_code": serializers.IntegerField(allow_null=True),
        "close_reason": serializers.CharField(),
        "created_at": serializers.DateTimeField(),
        "ended_at": serializers.DateTimeField(allow_null=True),
    },
)


class SessionListView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(
        responses=inline_serializer(
            "SpeechSessionPage",
            {"results": SESSION_SCHEMA.__class__(many=True), "next": serializers.CharField()},
        ),
        parameters=[
            OpenApiParameter("limit", OpenApiTypes.INT),
            OpenApiParameter("cursor", OpenApiTypes.STR),
        ],
        summary="Realtime sessions, newest first",
        operation_id="api_v1_sessions_list",
    )
    def get(self, request: Request) -> Response:
        paginator = JobCursorPagination()
        rows = SpeechSession.objects.filter(organization=self.organization)
        page: list[Any] = paginator.paginate_queryset(rows, request, view=self) or []
        return paginator.get_paginated_response([session_view(s) for s in page])


class SessionDetailView(TenantAPIView):
    required_scopes = {"GET": "speech:read"}

    @extend_schema(responses=SESSION_SCHEMA, summary="One realtime session")
    def get(self, request: Request, session_id: str) -> Response:
        session = self.tenant_object(SpeechSession.objects.all(), session_id, "session")
        return Response(session_view(session))
