"""The gateway retries a 5xx that comes before the first byte on the next endpoint, and never leaves the
route: engines and the control plane are small local HTTP servers here (no database)."""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.support.gateway import Gateway

pytestmark = pytest.mark.slow
TOKEN = "cpt_retry000_secret"


def serve(answer):  # type: ignore[no-untyped-def]
    """A local HTTP server whose handler calls ``answer(handler)``; returns (url, hits)."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            answer(self)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", hits


def reply(handler, status: int, body: dict) -> None:  # type: ignore[no-untyped-def, type-arg]
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_a_5xx_before_the_first_byte_is_retried_on_the_next_compliant_endpoint(tmp_path):
    broken, broken_hits = serve(lambda h: reply(h, 503, {"error": "overloaded"}))
    answer = {
        "choices": [{"message": {"content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    healthy, healthy_hits = serve(lambda h: reply(h, 200, answer))
    endpoint = {"deployment": 1, "version": "m@1", "served_model": "m", "weight": 100, "artifact_sha256": ""}
    route = {
        "endpoints": [
            {**endpoint, "url": broken, "region": "eu-west-1", "priority": 0},
            {**endpoint, "url": healthy, "region": "eu-central-1", "priority": 1},
        ],
        "preferred": "eu-west-1",
    }
    table = {
        "generation": 1,
        "etag": "one",
        "table": {
            "tenants": {"acme": {"limits": {}, "blocked": "", "models": {"chat": route}}},
            "credentials": {
                hashlib.sha256(TOKEN.encode()).hexdigest(): {"tenants": ["acme"], "expires": None}
            },
        },
    }

    def control_plane(handler) -> None:  # type: ignore[no-untyped-def]
        if handler.path.startswith("/api/v1/usage/"):
            return reply(handler, 200, {"accepted": 0})
        return reply(handler, 200, table)

    control, _ = serve(control_plane)
    gateway = Gateway(control, "gateway-token", tmp_path / "routes.json", tmp_path / "gateway.log")
    try:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        first = requests.post(f"{gateway.url}/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert first.status_code == 200 and first.headers["x-served-region"] == "eu-central-1"
        assert len(broken_hits) == 1 and len(healthy_hits) == 1  # tried home once, then the next tier
        second = requests.post(f"{gateway.url}/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert second.status_code == 200 and len(broken_hits) == 1  # home is ejected for 30 s
    finally:
        gateway.stop()
