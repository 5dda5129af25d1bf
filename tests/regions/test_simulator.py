"""The engine simulator validates requests as vLLM does: a malformed body is a 400, never a dropped
connection (which gateways read as an engine failure and eject the endpoint for every tenant), and no
``max_tokens`` makes it build an unbounded answer."""

import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from regions.engines.simulator import TTFT_BUCKETS, Engine, Handler


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


def histogram(url: str, name: str) -> dict[float, float]:
    """{le: cumulative count} of a histogram the engine exposes, read with Prometheus's own parser."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
    return {float(s.labels["le"]): s.value for s in families[name].samples if s.name == name + "_bucket"}


def test_time_to_first_token_is_a_histogram_with_vllms_buckets_and_the_delay_shows_in_it():
    Handler.engine = Engine("tiny", max_model_len=2048, ttft_delay=0.06)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert set(histogram(url, "vllm:time_to_first_token_seconds").values()) == {
            0.0
        }  # exposed from the start
        post(url, "/v1/chat/completions", {**CHAT, "max_tokens": 2})
        streamed = urllib.request.Request(
            url + "/v1/completions",
            data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(streamed, timeout=5) as reply:
            assert reply.read().endswith(b"data: [DONE]\n\n")
        buckets = histogram(url, "vllm:time_to_first_token_seconds")
    finally:
        server.shutdown()
    assert sorted(buckets) == [*TTFT_BUCKETS, math.inf]
    assert TTFT_BUCKETS[:8] == (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1)  # vLLM's, as it has them
    assert buckets[0.06] == 0 and buckets[math.inf] == 2  # both requests waited at least the 0.06 s delay
