"""The API's JSON parser: what PostgreSQL cannot store, or Python cannot decode, is a 400 up front.

PostgreSQL refuses a NUL character (U+0000) in text and in ``jsonb``; without this check such a body
reached the database and answered 500. One walk of the decoded body covers every field of every
endpoint — labels, policies, report hardware, driver configuration, plain strings — keys included.
"""

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import render
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from core.api.conventions import envelope
from core.errors import ValidationFailed

MAX_JSON_DEPTH = 64


def nul_location(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Where the first NUL in a decoded JSON value is (``labels.team``, ``[2]``), or None. Iterative, so
    no input can exhaust the stack; nesting deeper than ``max_depth`` is itself refused."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > max_depth:
            raise ParseError(f"The JSON body is nested deeper than {max_depth} levels.")
        if isinstance(item, str):
            if "\x00" in item:
                return where or "(the body)"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                path = f"{where}.{key}" if where else str(key)
                if "\x00" in str(key):
                    return f"a key in {where or '(the body)'}"
                stack.append((child, path, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


def reject_nul(value: Any) -> None:
    where = nul_location(value)
    if where is not None:
        raise ParseError(
            f"The request contains a NUL character (\\u0000) at {where}; NUL is not allowed in any string."
        )


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, refusing NUL characters, over-deep nesting and input that overflows the decoder."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"The JSON body is nested deeper than {MAX_JSON_DEPTH} levels.") from exc
        reject_nul(data)
        return data


def _has_nul(values: QueryDict) -> bool:
    return any("\x00" in key or any("\x00" in v for v in values.getlist(key)) for key in values)


class RejectNulMiddleware:
    """A NUL in the path, the query string (``?q=%00``), a header or a console form's fields is a 400
    before any view or query runs: path parameters, filters, headers such as ``Idempotency-Key`` and form
    fields all reach the database. (API bodies are JSON, checked by ``JSONBodyParser``; the console's
    forms are form-encoded, checked here, once.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = request.path.startswith("/api/")
        if "\x00" in request.path or _has_nul(request.GET):
            where = "the address (a %00 in the path or query)"
        elif any("\x00" in str(v) for k, v in request.META.items() if k.startswith("HTTP_")):
            where = "a header (Idempotency-Key, Authorization…)"
        elif not api and request.method == "POST" and _has_nul(request.POST):
            where = "a form field"
        else:
            return self.get_response(request)
        message = f"NUL characters are not allowed, and {where} contains one. Remove it and try again."
        if api:
            return JsonResponse(envelope("malformed_request", message), status=400)
        return render(request, "error.html", {"status": 400, "message": message}, status=400)


class RejectOversizedBodyMiddleware:
    """A body whose declared length is over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is a 413 before anything reads
    it (Django would read up to the limit, then answer a bare 400 and log a traceback at ERROR)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if limit is None or declared <= limit:
            return self.get_response(request)
        message = f"The request body is {declared} bytes; at most {limit} are accepted."
        if request.path.startswith("/api/"):
            return JsonResponse(envelope("request_too_large", message), status=413)
        return render(request, "error.html", {"status": 413, "message": message}, status=413)


def utc_instant(at: datetime, name: str) -> datetime:
    """A caller's aware time as UTC. PostgreSQL refuses offsets past ±15:59 that Python accepts (a 500
    before), and an instant before year 1 in UTC cannot be represented: both are a 400 naming ``name``."""
    try:
        return at.astimezone(UTC)
    except OverflowError as exc:
        raise ValidationFailed(f"{name}: {at.isoformat()} is outside the representable range.") from exc
