"""Priorities and load shedding: while every endpoint a request would go to is saturated, batch requests
are refused with Retry-After and interactive ones go on; on a shared deployment a tenant holding its fair
share of the requests in flight is refused so the others are not starved; a client may lower its class,
never raise it."""

import threading

import pytest

from gateway import contract
from gateway.admission import Admission, request_priority
from gateway.inbound import Refused
from tests.support.gateway_harness import TOKENS, digest, endpoint


def test_a_client_may_lower_its_class_but_never_raise_it():
    assert request_priority({}, None) == "interactive"
    assert request_priority({}, "batch") == "batch"
    assert request_priority({"x-priority": "batch"}, "interactive") == "batch"
    assert request_priority({"x-priority": "interactive"}, "batch") == "batch"
    assert request_priority({}, "made-up") == "interactive"  # an unknown class in the table: the default
    for bad in ("urgent", "", "batch\x00", "INTERACTIVE"):
        with pytest.raises(Refused) as refused:
            request_priority({"x-priority": bad}, None)
        assert refused.value.status == 400


def full(url: str, shared: bool = False) -> dict:  # type: ignore[type-arg]
    return {**endpoint(url, shared), "saturated": True}


def test_batch_is_shed_only_while_every_endpoint_of_the_tier_is_saturated():
    admission = Admission()
    tier = [full("http://a"), endpoint("http://b")]
    assert admission.shed("acme", "batch", tier) == ""  # b has room
    tier[1] = full("http://b")
    assert "batch requests are shed" in admission.shed("acme", "batch", tier)
    assert admission.shed("acme", "interactive", tier) == ""
    assert admission.stats() == {"shed_batch": 1, "shed_fair_share": 0}


def test_this_processes_own_requests_in_flight_saturate_an_endpoint():
    admission = Admission(max_in_flight=2)
    tier = [endpoint("http://a")]
    admission.start(tier[0], "acme")
    assert admission.shed("acme", "batch", tier) == ""
    admission.start(tier[0], "acme")
    assert admission.shed("acme", "batch", tier) != ""
    admission.end(tier[0], "acme")
    assert admission.shed("acme", "batch", tier) == ""


def test_on_a_saturated_shared_deployment_a_tenant_past_its_fair_share_waits_for_the_others():
    admission = Admission()
    tier = [full("http://shared", shared=True)]
    for _ in range(6):
        admission.start(tier[0], "acme")
    assert admission.shed("acme", "interactive", tier) == ""  # alone: nobody to starve
    admission.start(tier[0], "globex")
    assert "fair share" in admission.shed("acme", "interactive", tier)  # 6 of 7, fair is 4
    assert admission.shed("globex", "interactive", tier) == ""
    assert admission.shed("initech", "interactive", tier) == ""  # none in flight yet
    balanced = Admission()
    for tenant in ("acme", "globex"):
        balanced.start(tier[0], tenant)
    assert balanced.shed("acme", "interactive", tier) == ""  # equal shares: everyone goes on
    dedicated = [full("http://own")]
    assert admission.shed("acme", "interactive", dedicated) == ""  # only shared pools are split fairly


def test_a_saturated_model_refuses_batch_with_retry_after_and_serves_interactive(gw):
    gw.serve({"endpoints": [full(gw.engine.url)], "preferred": "eu-west-1"})
    refused = gw.chat(headers={"x-priority": "batch"})
    assert refused.status == 503 and refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["code"] == "overloaded"
    assert gw.chat().status == 200
    assert len(gw.engine.seen) == 1  # the shed request never reached the engine
    gw.serve({"endpoints": [endpoint(gw.engine.url)], "preferred": "eu-west-1"})
    assert gw.chat(headers={"x-priority": "batch"}).status == 200


def test_a_batch_token_is_shed_whatever_it_asks_for(gw):
    gw.gateway.routes.body["credentials"][digest(TOKENS["acme"])]["priority"] = contract.BATCH
    gw.serve({"endpoints": [full(gw.engine.url)], "preferred": "eu-west-1"})
    assert gw.chat(headers={"x-priority": "interactive"}).status == 503
    assert gw.chat(headers={"x-priority": "nonsense"}).status == 400


def test_requests_in_flight_at_one_engine_are_counted_while_they_run(gw):
    gw.engine.hold = threading.Event()
    gw.gateway.admission.max_in_flight = 1
    first = threading.Thread(target=gw.chat)
    first.start()
    try:
        while not gw.engine.seen:
            threading.Event().wait(0.01)
        assert gw.chat(headers={"x-priority": "batch"}).status == 503
    finally:
        gw.engine.hold.set()
        first.join(timeout=10)
    assert gw.gateway.admission.at_endpoint == {} and gw.gateway.admission.by_deployment == {}
