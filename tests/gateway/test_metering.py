"""Every request the gateway forwards to an engine makes exactly one usage record, whatever the engine
reports as ``usage`` and however the response ends (the engine failing mid-stream, the client gone)."""

import pytest

from gateway.metering import usage_tokens
from tests.support.gateway_harness import GatewayWorld


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": None, "completion_tokens": None},
        {"prompt_tokens": "5", "completion_tokens": [2]},
        {"prompt_tokens": -3, "completion_tokens": float("nan")},
        {"prompt_tokens": True, "completion_tokens": 1e300},
        [1, 2],
        "lots",
        7,
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_unreadable_usage_is_recorded_as_zero_tokens(gw, usage, stream):
    gw.engine.usage = usage
    answer = gw.chat(stream=stream)
    assert answer.status == 200
    assert gw.ship() == 1
    (record,) = gw.control.records
    assert record["request_id"] == answer.headers["x-request-id"] and record["status"] == 200
    assert isinstance(record["prompt_tokens"], int) and 0 <= record["prompt_tokens"] < 2**31
    assert isinstance(record["completion_tokens"], int) and 0 <= record["completion_tokens"] < 2**31


def test_usage_values_are_coerced_to_whole_non_negative_numbers():
    assert usage_tokens({"n": 5}, "n") == 5 and usage_tokens({"n": 5.9}, "n") == 5
    assert usage_tokens({"n": None}, "n") == usage_tokens({"n": "5"}, "n") == 0
    assert usage_tokens({"n": -1}, "n") == usage_tokens({"n": True}, "n") == 0
    assert usage_tokens({"n": float("inf")}, "n") == usage_tokens([], "n") == 0
    assert usage_tokens({"n": 10**12}, "n") == 2**31 - 1


def test_an_engine_failing_mid_stream_still_makes_a_record(gw):
    gw.engine.break_stream = True
    answer = gw.chat(stream=True)
    assert answer.status == 200 and b'"content": "a"' in answer.body  # the first event got through
    assert gw.ship() == 1
    (record,) = gw.control.records
    assert record["request_id"] == answer.headers["x-request-id"]
    assert record["status"] == 502 and record["stream"] is True


def test_every_endpoint_failing_makes_a_record_with_502(gw):
    gw.engine.server.shutdown()
    gw.engine.server.server_close()  # connection refused
    answer = gw.chat()
    assert answer.status == 502
    assert gw.ship() == 1
    (record,) = gw.control.records
    assert record["status"] == 502 and record["prompt_tokens"] == record["completion_tokens"] == 0


def test_a_client_gone_mid_response_makes_a_record_with_499(gw):
    gw.engine.usage = None

    async def gone(message):  # type: ignore[no-untyped-def]
        if message["type"] == "http.response.body":
            raise OSError("client disconnected")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", b"Bearer cpt_acme0000_secret")],
    }
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():  # type: ignore[no-untyped-def]
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    with pytest.raises(OSError):
        gw.run(gw.gateway.handle(scope, receive, gone))
    assert gw.ship() == 1
    (record,) = gw.control.records
    assert record["status"] == 499


def test_requests_the_gateway_refuses_itself_make_no_record(gw):
    assert gw.chat(model="nope").status == 404
    assert gw.chat(tenant=None).status == 401
    assert gw.ship() == 0 and gw.control.records == []
