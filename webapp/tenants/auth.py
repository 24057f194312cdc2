"""API key authentication: ``Authorization: Bearer tts_<prefix>_<secret>``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from webapp.client_ip import client_ip
from webapp.tenants import auth_failures
from webapp.tenants.models import ApiKey
from webapp.tenants.services import find_api_key, key_role, touch_api_key


class ApiKeyUser:
    """The principal of an API request: the key, its tenant and the role it acts with (not a Django user)."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.organization = key.organization
        self.role = key_role(key)
        # The user the key acts for (None for a tenant key the operator issued).
        self.user_id: int | None = key.user_id

    @property
    def pk(self) -> str:
        return str(self.key.pk)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKeyUser, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        address = client_ip(request)
        parts = header.split()
        well_formed = len(parts) == 2 and parts[0].lower() == "bearer"
        key = find_api_key(parts[1]) if well_formed else None
        if key is not None:
            # A valid key is never refused for what other credentials did from its address
            # (every tenant behind one NAT would be locked out by one stranger).
            touch_api_key(key, address)
            return ApiKeyUser(key), key
        # Nginx lets credentials past its anonymous zones: an address whose credentials keep
        # failing gets a small budget of failures, then 429 (webapp/tenants/auth_failures.py).
        auth_failures.refuse_if_spent(address)
        auth_failures.record_failure(address)
        if not well_formed:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header; expected 'Bearer <api key>'."
            )
        raise exceptions.AuthenticationFailed("Invalid, expired or revoked API key.")

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Tells drf-spectacular how API keys are sent (a Bearer token)."""

    target_class = "webapp.tenants.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "tts_<prefix>_<secret>"}


# TEMPORARY: replaced by the credentials module of branch wt-edge on merge.
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from webapp.errors import DomainError, ErrorCode  # noqa: E402


@dataclass(frozen=True)
class Credential:
    token: str
    source: str
    subprotocol: str | None


class MalformedCredential(Exception):
    pass


def credential_from(
    headers: Mapping[str, str], query_string: str = "", subprotocols: Sequence[str] = ()
) -> Credential | None:
    header = headers.get("authorization", "")
    if header:
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() not in ("bearer", "token"):
            raise MalformedCredential("expected 'Bearer <api key>'")
        return Credential(parts[1], parts[0].lower(), None)
    return None


def authenticate_credential(credential: Credential | None, address: str | None) -> ApiKey:
    if credential is None:
        raise DomainError(ErrorCode.UNAUTHENTICATED, "No API key.")
    key = find_api_key(credential.token)
    if key is not None:
        touch_api_key(key, address)
        return key
    auth_failures.refuse_if_spent(address)
    auth_failures.record_failure(address)
    raise DomainError(ErrorCode.UNAUTHENTICATED, "Invalid, expired or revoked API key.")
