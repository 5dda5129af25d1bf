"""Hostile input at the gateway is refused with a 4xx in OpenAI's error shape, never a 500 and never
forwarded: bodies over the limit (refused while reading), JSON nested too deep, bodies of the wrong shape."""

import json
from pathlib import Path

import pytest

from tests.support.gateway_harness import GatewayWorld

CHAT = "/v1/chat/completions"


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path, max_body_bytes=4096, max_json_depth=16)
    yield world
    world.close()


def refused(answer, status: int, code: str) -> bool:  # type: ignore[no-untyped-def]
    return answer.status == status and answer.json()["error"]["code"] == code


def test_json_nested_past_pythons_recursion_limit_is_a_400(tmp_path):
    gw = GatewayWorld(tmp_path)  # the default limits: 10 MiB, depth 64
    try:
        deep = b'{"model": "chat", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        assert refused(gw.call("POST", CHAT, deep), 400, "invalid_request")
        assert gw.engine.seen == []
    finally:
        gw.close()


def test_json_nested_past_the_limit_is_a_400_and_within_it_is_served(gw):
    def nested(depth: int) -> dict:  # type: ignore[type-arg]
        value: object = "x"
        for _ in range(depth):
            value = [value]
        return {"model": "chat", "messages": [], "metadata": value}

    answer = gw.call("POST", CHAT, nested(20))
    assert refused(answer, 400, "invalid_request") and "nested" in answer.json()["error"]["message"]
    assert gw.call("POST", CHAT, nested(10)).status == 200
    assert len(gw.engine.seen) == 1


def test_a_body_over_the_limit_is_refused_while_reading(gw):
    chunk = b"x" * 1000
    answer = gw.call("POST", CHAT, chunks=[b'{"model": "chat", "pad": "'] + [chunk] * 50_000)
    assert refused(answer, 413, "request_too_large")
    assert gw.messages_read <= 6  # stopped at the limit, not after 50 MB
    declared = gw.call("POST", CHAT, b"{}", headers={"Content-Length": str(50 * 2**20)})
    assert refused(declared, 413, "request_too_large") and gw.messages_read == 0
    assert gw.engine.seen == []


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2]",
        b'"chat"',
        b"null",
        b'{"model": 5}',
        b'{"model": {"name": "chat"}}',
        b'{"model": ""}',
        b'{"messages": []}',
        b'{"model": "chat", "stream": "yes"}',
        b'{"model": "chat", "stream": true, "stream_options": "include_usage"}',
        b'{"model": "chat", "stream": true, "stream_options": [true]}',
        b'{"model": "chat", "stream": true, "stream_options": 1}',
        b'{"model": "chat", "stream": true, "stream_options": {"include_usage": "yes"}}',
        b'{"model": "chat", "stream": true, "stream_options": {"include_usage": 1}}',
        b"\xff\xfe{}",
    ],
)
def test_bodies_of_the_wrong_shape_are_a_400(gw, body):
    assert refused(gw.call("POST", CHAT, body), 400, "invalid_request")
    assert gw.engine.seen == []


def test_stream_options_null_is_as_if_absent(gw):
    body = {"model": "chat", "messages": [], "stream": True, "stream_options": None}
    answer = gw.call("POST", CHAT, body)
    assert answer.status == 200 and answer.body.endswith(b"data: [DONE]\n\n")
    assert gw.engine.seen[0]["body"]["stream_options"] == {"include_usage": True}  # metering still works


def test_a_long_authorization_header_is_a_401_and_huge_headers_a_431(gw):
    answer = gw.call("POST", CHAT, {"model": "chat"}, headers={"Authorization": "Bearer " + "x" * 10_000})
    assert refused(answer, 401, "invalid_api_key")
    assert json.loads(answer.body)["error"]["request_id"]
    huge = gw.call("POST", CHAT, {"model": "chat"}, headers={"X-Padding": "x" * 100_000})
    assert refused(huge, 431, "headers_too_large") and gw.engine.seen == []


@pytest.mark.slow
def test_a_50_mb_body_through_uvicorn_is_refused_without_being_buffered(tmp_path):
    import requests

    from tests.support.gateway import Gateway
    from tests.support.gateway_harness import TOKENS

    world = GatewayWorld(tmp_path / "fakes")
    gateway = Gateway(world.control.url, "gw", tmp_path / "routes.json", tmp_path / "gateway.log")
    auth = {"Authorization": f"Bearer {TOKENS['acme']}", "Content-Type": "application/json"}
    url = f"{gateway.url}{CHAT}"

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "chat", "pad": "'
        for _ in range(50):
            yield b"x" * 2**20
        yield b'"}'

    try:
        declared = requests.post(url, data=b"".join(chunks()), headers=auth, timeout=30)
        chunked = requests.post(url, data=chunks(), headers=auth, timeout=30)
        assert declared.status_code == chunked.status_code == 413
        assert world.engine.seen == []
        status = (Path(f"/proc/{gateway.proc.pid}/status")).read_text()
        peak_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
        assert peak_kib < 120 * 1024  # about 55 MB measured: the 50 MB never sat in the gateway
        assert requests.post(url, json={"model": "chat", "messages": []}, headers=auth, timeout=10).ok
    finally:
        gateway.stop()
        world.close()
