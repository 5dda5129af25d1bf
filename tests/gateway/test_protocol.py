"""The gateway speaks HTTP and OpenAI's streaming as clients expect: the usage-only final chunk reaches
only clients that asked for it, unknown paths are 404 (before authentication), wrong methods 405."""

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.streaming import EventFilter
from tests.support.gateway_harness import GatewayWorld

CHAT = "/v1/chat/completions"


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def events(body: bytes) -> list[object]:
    return [json.loads(e[6:]) for e in body.split(b"\n\n") if e.startswith(b"data: {")]


def test_the_usage_chunk_is_forwarded_only_when_the_client_asked(gw):
    plain = gw.chat(stream=True)
    assert plain.status == 200 and plain.body.endswith(b"data: [DONE]\n\n")
    assert all(e["choices"] for e in events(plain.body))  # chunk.choices[0] never fails
    asked = gw.chat(stream=True, stream_options={"include_usage": True})
    assert events(asked.body)[-1] == {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    declined = gw.chat(stream=True, stream_options={"include_usage": False})
    assert all(e["choices"] for e in events(declined.body))
    assert all(seen["body"]["stream_options"]["include_usage"] is True for seen in gw.engine.seen)
    gw.ship()
    assert [r["completion_tokens"] for r in gw.control.records] == [2, 2, 2]  # metered either way


STREAM = (
    b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    b'data: {"choices": [{"delta": {"content": "b"}}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n'
    b"data: [DONE]\n\n"
)


@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=8), crlf=st.booleans(), keep=st.booleans())
def test_the_filter_finds_the_usage_however_the_stream_is_cut(cuts, crlf, keep):
    stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    edges = [0, *sorted(c * len(stream) // len(STREAM) for c in cuts), len(stream)]
    found = EventFilter(forward_usage_chunk=keep)
    out = b"".join(found.feed(stream[a:b]) for a, b in pairwise(edges)) + found.flush()
    assert found.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert (b'"choices": []' in out) is keep
    assert out.count(b"data: ") == (4 if keep else 3) and out.endswith(
        b"[DONE]" + (b"\r\n\r\n" if crlf else b"\n\n")
    )


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_unknown_paths_are_404_and_wrong_methods_405(gw, tenant):
    for path in ("/v1/nothing", "/", "/admin", "/v1/chat/completions/x"):
        answer = gw.call("GET", path, tenant=tenant)
        assert answer.status == 404 and answer.json()["error"]["code"] == "not_found"
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        answer = gw.call("GET", path, tenant=tenant)
        assert answer.status == 405 and answer.headers["allow"] == "POST"
        assert answer.json()["error"]["code"] == "method_not_allowed"
    posted = gw.call("POST", "/v1/models", tenant=tenant)
    assert posted.status == 405 and posted.headers["allow"] == "GET"
    assert gw.call("POST", "/v1/nothing", {"model": "chat"}, tenant=tenant).status == 404


def test_known_paths_still_need_a_token(gw):
    assert gw.call("GET", "/v1/models", tenant=None).status == 401
    assert gw.call("POST", CHAT, {"model": "chat"}, tenant=None).status == 401
    assert gw.call("GET", "/v1/models").status == 200
