"""Reading a client's request: the body within a size limit, JSON within a nesting limit, the shape the
proxied endpoints need. Every refusal is a ``Refused`` carrying the HTTP status and error code."""

import hashlib
import json
from typing import Any

from gateway import contract

# vLLM's pooling runner's endpoints: no sampling, no stream, no prefix cache to share or route by.
POOLING = {"/v1/embeddings", "/v1/rerank", "/classify"}
PROXIED = {"/v1/chat/completions", "/v1/completions", *POOLING}
METHODS = {"/v1/models": "GET", **dict.fromkeys(PROXIED, "POST")}  # every path a gateway answers
PREVIEW_HEADER = "x-rollout-track"
TRACKS = (contract.STABLE, contract.CANDIDATE)
LONGEST_SESSION_KEY = 256  # longer keys are cut: two sessions alike that far only share a revision


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


async def read_body(receive: Any, headers: dict[str, str], limit: int) -> bytes:
    """The whole body, refused (413) as soon as it passes ``limit``: never buffered past it."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "The client went away before sending the whole body.")
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise _too_large(limit)
        chunks.append(body)
        if not message.get("more_body"):
            return b"".join(chunks)


def _too_large(limit: int) -> Refused:
    return Refused(413, f"The request body is larger than {limit} bytes.", "request_too_large")


def parse_payload(body: bytes, max_depth: int) -> dict[str, Any]:
    """The request as a JSON object with a string ``model``; ``stream``/``stream_options`` well-typed."""
    try:
        payload = json.loads(body)
    except RecursionError as exc:
        raise Refused(400, f"The JSON body is nested deeper than {max_depth} levels.") from exc
    except ValueError as exc:  # also bytes that are not UTF-8
        raise Refused(400, "The body must be JSON with a 'model' field.") from exc
    if json_depth(payload) > max_depth:
        raise Refused(400, f"The JSON body is nested deeper than {max_depth} levels.")
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str) or not payload["model"]:
        raise Refused(400, "The body must be a JSON object with a 'model' string.")
    if not isinstance(payload.get("stream", False), bool):
        raise Refused(400, "'stream' must be true or false.")
    if payload.get("stream_options") is None:
        payload.pop("stream_options", None)  # null is as if absent
    elif not isinstance(payload["stream_options"], dict):
        raise Refused(400, "'stream_options' must be an object.")
    elif not isinstance(payload["stream_options"].get("include_usage", False), bool):
        raise Refused(400, "'stream_options.include_usage' must be true or false.")
    if "cache_salt" in payload and (not isinstance(payload["cache_salt"], str) or not payload["cache_salt"]):
        raise Refused(400, "'cache_salt' must be a non-empty string.")
    return payload


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def preview_track(headers: dict[str, str]) -> str | None:
    """The revision a client asked for with ``x-rollout-track`` (blue-green preview), None when it did not.
    The value is never echoed back: it is untrusted, and an error body is no place to reflect it."""
    raw = headers.get(PREVIEW_HEADER, "")
    if len(raw) > 32:
        raise _bad_track()
    value = raw.strip().lower()
    if not value:
        return None
    if value not in TRACKS:
        raise _bad_track()
    return value


def _bad_track() -> Refused:
    return Refused(400, f"{PREVIEW_HEADER} must be 'stable' or 'candidate'.", "invalid_rollout_track")


def session_key(headers: dict[str, str], payload: dict[str, Any]) -> str | None:
    """What keeps a conversation on one engine and one revision: ``x-session-id``, else the body's
    ``user``."""
    key = headers.get("x-session-id") or payload.get("user")
    return key[:LONGEST_SESSION_KEY] if isinstance(key, str) and key else None


def client_request_id(headers: dict[str, str]) -> str:
    """The client's X-Request-ID, for its own correlation only: printable ASCII, at most 128 characters."""
    raw = headers.get("x-request-id", "").strip()
    return "".join(c for c in raw if " " <= c <= "~")[:128]


def bearer_digest(headers: dict[str, str]) -> str | None:
    """The SHA-256 of the request's bearer token, as the route table's credentials are keyed."""
    auth = headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        return None
    return hashlib.sha256(auth[7:].strip().encode()).hexdigest()
