"""The response side of one ASGI request: status and headers once, then the body, errors in OpenAI's shape."""

import json
from typing import Any


class Reply:
    """The response side of one ASGI request."""

    def __init__(self, send: Any, request_id: str):
        self.send, self.request_id, self.started = send, request_id, False
        self.client_gone = False  # the server refused a send: the client disconnected
        self.held_ms: float | None = None  # how long the request waited for its deployment to wake
        # Served by a fallback: why (x-degraded: capacity, budget, unavailable) and the model that served.
        self.degraded, self.served_name = "", ""
        self.trace_headers: dict[str, str] = {}  # traceparent for the engine, when tracing is on
        self.trace_id = ""
        self.cache = ""  # x-cache: "hit" or "miss" for a request the response cache looked up, else ""
        # A pipeline's stage request: (the pipeline's version, the stage), for its usage record. Set by
        # the gateway from its own scope, never from anything a client sends.
        self.pipeline: tuple[str, str] | None = None

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self.send(message)
        except Exception:
            self.client_gone = True
            raise

    async def start(
        self, status: int, content_type: str, extra: dict[str, str], length: int | None = None
    ) -> None:
        headers = [(b"content-type", content_type.encode()), (b"x-request-id", self.request_id.encode())]
        headers += [(k.encode(), v.encode()) for k, v in extra.items()]
        if self.held_ms is not None:
            headers.append((b"x-held-ms", f"{self.held_ms:.0f}".encode()))
        if self.degraded:
            headers.append((b"x-degraded", self.degraded.encode()))
        if self.cache:
            headers.append((b"x-cache", self.cache.encode()))
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True

    async def chunk(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def json(self, status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        await self.start(status, "application/json", extra or {}, length=len(data))
        await self.chunk(data, more=False)

    async def text(self, status: int, body: str) -> None:
        data = body.encode()
        await self.start(status, "text/plain; version=0.0.4; charset=utf-8", {}, length=len(data))
        await self.chunk(data, more=False)

    async def error(self, status: int, message: str, code: str, extra: dict[str, str] | None = None) -> None:
        """OpenAI's error shape, which its client libraries parse and show."""
        kind = "invalid_request_error" if status < 500 else "service_unavailable"
        error = {"message": message, "type": kind, "code": code, "request_id": self.request_id}
        await self.json(status, {"error": error}, extra)
