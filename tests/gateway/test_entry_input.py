"""The global entry in-process (gateway/entry.py) with a fake regional gateway: it forwards a request as the
client sent it, and refuses hostile or unauthorised input with a 4xx in OpenAI's error shape before
anything is forwarded."""

import json

import pytest

from gateway.entry import Entry
from tests.support.gateway_harness import TOKENS, GatewayWorld, settings

CHAT = "/v1/chat/completions"


@pytest.fixture
def entry(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    table = world.gateway.routes.body
    forwarding = Entry(
        settings(
            tmp_path,
            world.control.url,
            max_body_bytes=4096,
            max_json_depth=16,
            max_header_bytes=8192,
            entry_regions={
                "eu-west-1": world.engine.url
            },  # the fake engine stands in for the region's gateway
        )
    )
    forwarding.routes.body, forwarding.session = table, world.gateway.session
    gateway, world.gateway = world.gateway, forwarding  # type: ignore[assignment]
    yield world
    world.gateway = gateway
    world.close()


def refused(answer, status: int, code: str) -> bool:  # type: ignore[no-untyped-def]
    return answer.status == status and answer.json()["error"]["code"] == code


def test_a_request_is_forwarded_as_the_client_sent_it(entry):
    answer = entry.chat(user="u1")
    assert answer.status == 200
    forwarded = entry.engine.seen[-1]
    assert forwarded["body"]["model"] == "chat"  # the tenant's name: the regional gateway rewrites it
    assert forwarded["body"]["user"] == "u1"
    assert {k.lower(): v for k, v in forwarded["headers"].items()}[
        "authorization"
    ] == f"Bearer {TOKENS['acme']}"  # the client's own token


@pytest.mark.parametrize(
    ("body", "headers", "tenant", "status", "code"),
    [
        (b'{"model": "chat", "pad": "' + b"x" * 5000 + b'"}', {}, "acme", 413, "request_too_large"),
        (b'{"model": "chat", "m": ' + b"[" * 40 + b"]" * 40 + b"}", {}, "acme", 400, "invalid_request"),
        (b"[1, 2]", {}, "acme", 400, "invalid_request"),
        (b'{"model": "chat\\u0000"}', {}, "acme", 404, "model_not_found"),
        (json.dumps({"model": "chat"}).encode(), {}, None, 401, "invalid_api_key"),
        (
            json.dumps({"model": "chat"}).encode(),
            {"Authorization": "Bearer cpt_nobody_x"},
            None,
            401,
            "invalid_api_key",
        ),
        (json.dumps({"model": "chat"}).encode(), {}, "globex", 404, "model_not_found"),  # acme's model
        (
            json.dumps({"model": "chat"}).encode(),
            {"OpenAI-Organization": "globex"},
            "acme",
            401,
            "invalid_api_key",
        ),
        (json.dumps({"model": "chat"}).encode(), {"X-Pad": "y" * 9000}, "acme", 431, "headers_too_large"),
    ],
    ids=[
        "too large",
        "too deep",
        "not an object",
        "NUL in the name",
        "no token",
        "unknown token",
        "another tenant's model",
        "another organization",
        "huge headers",
    ],
)
def test_hostile_input_is_refused_before_anything_is_forwarded(entry, body, headers, tenant, status, code):
    assert refused(entry.call("POST", CHAT, body, headers, tenant), status, code)
    assert entry.engine.seen == []


def test_unknown_paths_and_methods(entry):
    assert refused(entry.call("GET", "/v1/secrets"), 404, "not_found")
    assert refused(entry.call("GET", CHAT), 405, "method_not_allowed")
    models = entry.call("GET", "/v1/models", tenant="globex").json()["data"]
    assert [m["id"] for m in models] == ["shared"]


def test_a_pipeline_goes_to_a_gateway_where_the_tenants_data_may_be_processed(entry):
    view = entry.gateway.routes.body["tenants"]["acme"]
    stage = {"name": "answer", "kind": "model", "inputs": {"messages": "request.messages"}, "output": "text"}
    support = {"version": "acme/support@1", "budget_ms": 1000, "output": ["answer"], "stages": [stage]}
    view["pipelines"] = {"support": {**support, "regions": ["eu-west-1"]}}
    answer = entry.chat(model="support")
    assert answer.status == 200 and entry.engine.seen[-1]["body"]["model"] == "support"  # forwarded as sent
    view["pipelines"] = {"support": {**support, "regions": ["eu-central-1"]}}  # no gateway of ours there
    assert refused(entry.chat(model="support"), 503, "model_unavailable")
