"""``/api/v1/webhooks``: a tenant's owners and admins manage its webhook endpoints.

Every call needs the ``keys:manage`` scope (the tenant-configuration scope, which only owners
and admins can use): an endpoint receives the tenant's events, and its secret signs them.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import DomainError, ErrorCode
from webapp.tenants.api.base import TenantAPIView
from webapp.tenants.models import ApiKey
from webapp.webhooks import delivery, services
from webapp.webhooks.models import (
    JobWebhookSecret,
    WebhookAttempt,
    WebhookEndpoint,
    WebhookMessage,
)
from webapp.webhooks.serializers import (
    DeliveryListSerializer,
    DeliverySerializer,
    EndpointListSerializer,
    EndpointSerializer,
    EndpointWriteSerializer,
    JobSecretSerializer,
    NewSecretEndpointSerializer,
    RotateSerializer,
)

MANAGE = ApiKey.Scope.KEYS_MANAGE.value
ALL_MANAGE = {m: MANAGE for m in ("GET", "POST", "PATCH", "DELETE")}
DEFAULT_LIMIT, MAX_LIMIT = 50, 100


def _body(request: Request) -> dict[str, Any]:
    if request.data in (None, "") and not request.body:
        return {}
    if not isinstance(request.data, dict):
        raise DomainError(ErrorCode.INVALID_REQUEST, "The body must be a JSON object.")
    return dict(request.data)


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", str(DEFAULT_LIMIT))
    # ASCII digits only: "²".isdigit() is true and int("²") raises (a 500 before).
    if not (0 < len(raw) <= 9 and raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise DomainError(ErrorCode.INVALID_LIMIT, f"limit must be 1 - {MAX_LIMIT}.", field="limit")
    return int(raw)


def _with_secret(endpoint: WebhookEndpoint, status: int = 200, **headers: str) -> Response:
    response = Response(NewSecretEndpointSerializer(endpoint).data, status=status, headers=headers)
    response["Cache-Control"] = "no-store"
    return response


def _deliveries(request: Request, messages: QuerySet[WebhookMessage]) -> Response:
    attempts = Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("started_at", "id"))
    page = messages.prefetch_related(attempts).order_by("-created_at", "-id")[: _limit(request)]
    return Response({"results": DeliverySerializer(page, many=True).data})


LIMIT_PARAM = OpenApiParameter("limit", int, description=f"1 - {MAX_LIMIT}, default {DEFAULT_LIMIT}")


class EndpointListView(TenantAPIView):
    required_scopes = ALL_MANAGE

    @extend_schema(
        operation_id="api_v1_webhooks_list",
        responses=EndpointListSerializer,
        summary="This tenant's webhook endpoints",
    )
    def get(self, request: Request) -> Response:
        endpoints = WebhookEndpoint.objects.filter(organization=self.organization).order_by(
            "-created_at", "-id"
        )
        return Response({"results": EndpointSerializer(endpoints, many=True).data})

    @extend_schema(
        request=EndpointWriteSerializer,
        responses={201: NewSecretEndpointSerializer},
        summary="Add a webhook endpoint (its signing secret is shown once)",
    )
    def post(self, request: Request) -> Response:
        serializer = EndpointWriteSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        endpoint = services.create_endpoint(
            self.organization,
            data["url"],
            data["events"],
            description=data.get("description", ""),
            enabled=data.get("enabled", True),
        )
        return _with_secret(endpoint, 201, Location=reverse("api-webhook-detail", args=[endpoint.pk]))


class _OneEndpoint(TenantAPIView):
    """One endpoint's routes; each view declares only its own methods (a rotate URL answers no GET)."""

    required_scopes = ALL_MANAGE

    def _endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        return self.tenant_object(WebhookEndpoint.objects.all(), endpoint_id, "webhook endpoint")


class EndpointDetailView(_OneEndpoint):
    @extend_schema(responses=EndpointSerializer, summary="A webhook endpoint")
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(EndpointSerializer(self._endpoint(endpoint_id)).data)

    @extend_schema(
        request=EndpointWriteSerializer(partial=True),
        responses=EndpointSerializer,
        summary="Change a webhook endpoint",
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = self._endpoint(endpoint_id)
        serializer = EndpointWriteSerializer(data=_body(request), partial=True)
        serializer.is_valid(raise_exception=True)
        endpoint = services.update_endpoint(endpoint, dict(serializer.validated_data))
        return Response(EndpointSerializer(endpoint).data)

    @extend_schema(responses={204: None}, summary="Delete a webhook endpoint (and its delivery log)")
    def delete(self, request: Request, endpoint_id: str) -> Response:
        services.delete_endpoint(self._endpoint(endpoint_id))
        return Response(status=204)


class RotateSecretView(_OneEndpoint):
    @extend_schema(
        request=RotateSerializer,
        responses=NewSecretEndpointSerializer,
        summary="A new signing secret (shown once); the old one keeps signing for the overlap",
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        serializer = RotateSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        endpoint = services.rotate_secret(
            self._endpoint(endpoint_id), serializer.validated_data.get("overlap_seconds")
        )
        return _with_secret(endpoint)


class PingView(_OneEndpoint):
    @extend_schema(
        request=None, responses={202: DeliverySerializer}, summary="Send a ping event to the endpoint"
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        message = services.ping(self._endpoint(endpoint_id))
        return Response(DeliverySerializer(message).data, status=202)


class EndpointDeliveriesView(_OneEndpoint):
    @extend_schema(
        parameters=[LIMIT_PARAM],
        operation_id="api_v1_webhooks_endpoint_deliveries_list",
        responses=DeliveryListSerializer,
        summary="Deliveries to an endpoint, newest first",
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = self._endpoint(endpoint_id)
        return _deliveries(request, WebhookMessage.objects.filter(endpoint=endpoint))


class DeliveryListView(TenantAPIView):
    required_scopes = ALL_MANAGE

    @extend_schema(
        parameters=[LIMIT_PARAM, OpenApiParameter("event", str, description="Only this event type")],
        operation_id="api_v1_webhooks_deliveries_list",
        responses=DeliveryListSerializer,
        summary="Every delivery of this tenant (endpoints and jobs' own URLs), newest first",
    )
    def get(self, request: Request) -> Response:
        messages = WebhookMessage.objects.filter(organization=self.organization)
        event = request.query_params.get("event")
        if event:
            messages = messages.filter(event=event)
        return _deliveries(request, messages)


class RedeliverView(TenantAPIView):
    required_scopes = ALL_MANAGE

    @extend_schema(
        request=None, responses={202: DeliverySerializer}, summary="Send a delivery again (same webhook-id)"
    )
    def post(self, request: Request, delivery_id: str) -> Response:
        message = self.tenant_object(
            WebhookMessage.objects.select_related("endpoint"), delivery_id, "delivery"
        )
        message = services.redeliver(message)
        return Response(DeliverySerializer(message).data, status=202)


class JobSecretView(TenantAPIView):
    required_scopes = ALL_MANAGE

    @extend_schema(
        request=RotateSerializer,
        responses=JobSecretSerializer,
        summary="A new secret for submits' own webhook_url (shown once; the old one keeps signing for the overlap)",
    )
    def post(self, request: Request) -> Response:
        serializer = RotateSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            holder, created = JobWebhookSecret.objects.select_for_update().get_or_create(
                organization_id=self.organization.pk, defaults={"secret": delivery.new_secret()}
            )
            if not created:
                delivery.rotate(holder)
            services.overlap(holder, serializer.validated_data.get("overlap_seconds"))
            holder.save()
        response = Response({"secret": holder.secret, "previous_valid_until": holder.previous_valid_until})
        response["Cache-Control"] = "no-store"
        return response
