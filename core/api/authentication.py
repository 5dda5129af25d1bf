"""API authentication: bearer tokens (users and robots) and the dashboard's session, both as a Principal."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from core.choices import AuditSource
from core.models import ApiToken
from core.principal import Principal
from core.services.tokens import TokenRejected, token_authenticate


def principal_for_token(token: ApiToken, source: str) -> Principal:
    if token.user is not None:
        return Principal.for_user(token.user, source=source, token=token)
    assert token.service_account is not None  # the database guarantees exactly one owner
    return Principal.for_service_account(token.service_account, token=token, source=source)


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Principal, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        try:
            token = token_authenticate(raw.strip())
        except TokenRejected as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        return principal_for_token(token, AuditSource.API), token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class PrincipalSessionAuthentication(authentication.SessionAuthentication):
    """The logged-in dashboard user calling the API from the browser (CSRF enforced)."""

    def authenticate(self, request: Request) -> tuple[Principal, None] | None:
        result: Any = super().authenticate(request)
        if result is None:
            return None
        return Principal.for_user(result[0], source=AuditSource.API), None


class BearerScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "core.api.authentication.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


class SessionScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "core.api.authentication.PrincipalSessionAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
