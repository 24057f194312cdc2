"""``/api/v1/keys``: a tenant's owners and admins list, create and revoke its API keys."""

from __future__ import annotations

import datetime as dt

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.tenants.api.base import TenantAPIView
from webapp.tenants.api.serializers import (
    KeyCreateSerializer,
    KeyListSerializer,
    KeyRotateSerializer,
    KeySerializer,
    NewKeySerializer,
)
from webapp.tenants.models import ApiKey
from webapp.tenants.services import create_api_key, revoke_api_key, rotate_api_key

KEYS_MANAGE = ApiKey.Scope.KEYS_MANAGE.value


class KeyListView(TenantAPIView):
    required_scopes = {"GET": KEYS_MANAGE, "POST": KEYS_MANAGE}

    @extend_schema(responses=KeyListSerializer, summary="This tenant's API keys, newest first")
    def get(self, request: Request) -> Response:
        keys = ApiKey.objects.filter(organization=self.organization).select_related("user")
        data = KeySerializer(keys.order_by("-created_at", "-id"), many=True).data
        return Response({"results": data})

    @extend_schema(
        request=KeyCreateSerializer,
        responses={201: NewKeySerializer},
        summary="Create an API key (its secret is shown once)",
    )
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise DomainError(
                ErrorCode.INVALID_REQUEST, 'The body must be a JSON object, e.g. {"name": "ci"}.'
            )
        serializer = KeyCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        key, secret = create_api_key(
            self.organization,
            data["name"],
            created_by=request.auth,
            scopes=data.get("scopes"),
            expires_at=data.get("expires_at"),
            requests_per_minute=data.get("requests_per_minute"),
            monthly_characters=data.get("monthly_characters"),
        )
        key.secret = secret  # type: ignore[attr-defined]
        location = reverse("api-key-detail", args=[key.pk])
        response = Response(NewKeySerializer(key).data, status=201, headers={"Location": location})
        response["Cache-Control"] = "no-store"
        return response


class KeyDetailView(TenantAPIView):
    required_scopes = {"DELETE": KEYS_MANAGE}

    @extend_schema(responses={204: None}, summary="Revoke an API key")
    def delete(self, request: Request, key_id: str) -> Response:
        key = self.tenant_object(ApiKey.objects.all(), key_id, "key")
        revoke_api_key(key, by=request.auth)
        return Response(status=204)


class KeyRotateView(TenantAPIView):
    required_scopes = {"POST": KEYS_MANAGE}

    @extend_schema(
        request=KeyRotateSerializer,
        responses={200: NewKeySerializer},
        summary="A new secret for the same key; the old one works for overlap_seconds more",
    )
    def post(self, request: Request, key_id: str) -> Response:
        key = self.tenant_object(ApiKey.objects.select_related("organization"), key_id, "key")
        body = request.data if isinstance(request.data, dict) else {}
        serializer = KeyRotateSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        overlap = dt.timedelta(seconds=serializer.validated_data["overlap_seconds"])
        key.secret = rotate_api_key(key, by=request.auth, overlap=overlap)  # type: ignore[attr-defined]
        response = Response(NewKeySerializer(key).data)
        response["Cache-Control"] = "no-store"
        return response
