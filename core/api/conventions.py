"""The API's shared conventions: error envelope, pagination, throttling, strict input, ETags and
idempotent POSTs. Every app's API uses these, so a client learns them once."""

import json
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any, cast

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils.crypto import salted_hmac
from rest_framework import exceptions, serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from core.errors import ApplicationError, PreconditionFailed, Unprocessable, ValidationFailed
from core.models import IdempotencyRecord
from core.principal import Principal

DRF_CODES = {
    exceptions.ParseError: "malformed_request",
    exceptions.ValidationError: "invalid",
    exceptions.AuthenticationFailed: "unauthenticated",
    exceptions.NotAuthenticated: "unauthenticated",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "rate_limited",
}


def envelope(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail}}


def _summary(detail: Any) -> str:
    """A one-line human message from DRF's nested validation detail."""
    if isinstance(detail, Mapping):
        return "; ".join(f"{field}: {_summary(value)}" for field, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_summary(item) for item in detail)
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Imported here: rest_framework.views reads DEFAULT_THROTTLE_CLASSES, which points back at this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, ApplicationError):
        return Response(envelope(exc.code, exc.message, exc.detail), status=exc.status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    code = next((c for cls, c in DRF_CODES.items() if isinstance(exc, cls)), "error")
    if isinstance(exc, exceptions.ValidationError):
        message, detail = f"Invalid request: {_summary(exc.detail)}", exc.detail
    else:
        message, detail = str(exc.detail), None
    response.data = envelope(code, message, detail)
    return response


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


class PrincipalRateThrottle(SimpleRateThrottle):
    """Per-token (or per-user, per-robot) request rate; anonymous callers are limited by address."""

    scope = "principal"

    def get_cache_key(self, request: Request, view: Any) -> str:
        user = request.user
        if user is not None and getattr(user, "is_authenticated", False):
            ident = credential_key(request)
        else:
            ident = f"ip:{self.get_ident(request)}"
        return f"throttle:{self.scope}:{ident}"


def credential_key(request: Request) -> str:
    """The credential that sent an authenticated request: its token, or the session's user."""
    token = getattr(request, "auth", None)
    return f"token:{token.pk}" if token is not None else cast(Principal, request.user).key


class StrictSerializer(serializers.Serializer):
    """Rejects fields it does not know, so a typo is an error instead of a silently ignored setting."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(set(data) - known)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A JSON string and nothing else: DRF's CharField would take ``5`` as ``"5"``."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer and nothing else: DRF's IntegerField would take ``"3"`` and ``3.0``."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


def etag(pk: Any, revision: int) -> str:
    return f'"{pk}-{revision}"'


def expected_revision(request: Request, pk: Any) -> int | None:
    """The revision an If-Match header asks for; None when absent or ``*``."""
    header = request.headers.get("If-Match", "").strip()
    if not header or header == "*":
        return None
    tag = header.removeprefix("W/").strip('"')
    owner, _, revision = tag.rpartition("-")
    if owner != str(pk) or not revision.isdigit():
        raise PreconditionFailed("If-Match does not carry an ETag of this object; GET it first.")
    return int(revision)


def _request_fingerprint(request: Request) -> str:
    """Keyed with SECRET_KEY: a body can carry a password (``POST /users/``), and a plain hash of it in
    the database could be brute-forced offline by whoever reads the table."""
    body = json.dumps(request.data, sort_keys=True, default=str)
    message = f"{request.method} {request.path}\n{body}"
    return salted_hmac("controlplane.idempotency.request", message, algorithm="sha256").hexdigest()


# A view sets this on its Response: {field: note}. Those fields are blanked before the response is
# stored, so a secret is shown once and never persisted; a replay carries the note instead.
REDACT_ATTRIBUTE = "idempotency_redact"


def _storable(response: Response) -> Any:
    body = json.loads(json.dumps(response.data, default=str))
    for name, note in getattr(response, REDACT_ATTRIBUTE, {}).items():
        body[name] = None
        body[f"{name}_redacted"] = note
    return body


def _replay(record: IdempotencyRecord, fingerprint: str, principal: Principal) -> Response:
    if record.request_hash != fingerprint:
        raise Unprocessable(
            "This Idempotency-Key was already used with a different request.", code="idempotency_key_reused"
        )
    principal.recheck(record.required_checks)  # the credential may have lost the power since
    headers = {**record.response_headers, "Idempotent-Replayed": "true"}
    return Response(record.response_body, status=record.status_code, headers=headers)


def idempotent(method: Callable[..., Response]) -> Callable[..., Response]:
    """POST actions honour ``Idempotency-Key``: the same key and body replay the first response; the
    same key with another body is 422. A key belongs to the credential that sent it and to the endpoint
    (method and path); a replay passes the first request's permission checks again, and fields the view
    marks secret are never stored. The answer is stored in the action's own transaction, so a crash can
    never record a response for an action that did not happen."""

    @wraps(method)
    def wrapper(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return method(self, request, *args, **kwargs)
        if not 1 <= len(key) <= 200:
            raise ValidationFailed("Idempotency-Key must be 1 to 200 characters.")
        principal = cast(Principal, request.user)
        fingerprint = _request_fingerprint(request)
        scope = {
            "principal_key": credential_key(request),
            "method": request.method or "POST",
            "path": request.path,
            "key": key,
        }
        record = IdempotencyRecord.objects.filter(**scope).first()
        if record is not None:
            return _replay(record, fingerprint, principal)
        checks: list[dict[str, object]] = []
        principal.passed_checks = checks
        try:
            with transaction.atomic():
                response = method(self, request, *args, **kwargs)
                if 200 <= response.status_code < 300:
                    IdempotencyRecord.objects.create(
                        **scope,
                        request_hash=fingerprint,
                        status_code=response.status_code,
                        response_body=_storable(response),
                        response_headers={k: v for k, v in response.items() if k in {"Location", "ETag"}},
                        required_checks=checks,
                    )
        except IntegrityError:
            # A concurrent request with the same key won; answer as it did.
            winner = IdempotencyRecord.objects.filter(**scope).first()
            if winner is None:
                raise
            return _replay(winner, fingerprint, principal)
        return response

    return wrapper
