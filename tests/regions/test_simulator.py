"""The engine simulator validates requests as vLLM does: a malformed body is a 400, never a dropped
connection (which gateways read as an engine failure and eject the endpoint for every tenant), and no
``max_tokens`` makes it build an unbounded answer."""

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from regions.engines.simulator import Engine, Handler


@pytest.fixture
def engine_url() -> Iterator[str]:
    Handler.engine = Engine("tiny", max_model_len=2048)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def post(url: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 2**31}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -1}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "a"}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 1.5}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": True}),
        ("/v1/chat/completions", {"model": "tiny", "messages": "x"}),
        ("/v1/chat/completions", {"model": "tiny", "messages": ["x"]}),
        ("/v1/completions", {"model": "tiny", "prompt": {"a": 1}}),
        ("/v1/completions", [1, 2]),
        ("/v1/embeddings", "text"),
    ],
)
def test_a_malformed_request_is_a_400_like_vllms(engine_url, path, body):
    status, answer = post(engine_url, path, body)
    assert status == 400 and answer["error"]["type"] == "BadRequestError", answer


def test_a_request_within_the_context_is_served_with_its_usage(engine_url):
    status, answer = post(engine_url, "/v1/chat/completions", {**CHAT, "max_tokens": 5})
    assert status == 200 and answer["usage"]["completion_tokens"] == 5
