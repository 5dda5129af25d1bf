"""A connection that breaks before an answer (an engine closing a kept-alive connection just as the gateway
takes it) is tried again on a new connection, and costs the engine no ejection; a second break does."""

import aiohttp
from aiohttp.client_reqrep import ConnectionKey

from gateway.breakers import broken_connection
from tests.support.gateway_harness import endpoint


def test_a_connection_closed_unanswered_is_tried_again_without_ejecting_the_engine(gw):
    gw.engine.drop = 1
    answer = gw.chat()
    assert answer.status == 200, answer.body
    assert len(gw.engine.seen) == 2  # the dropped attempt and the one answered, on one engine
    assert not gw.gateway.breakers.ejected(gw.engine.url)
    assert gw.chat().status == 200 and len(gw.engine.seen) == 3


def test_a_second_break_ejects_the_engine_and_goes_on_to_the_next(gw):
    (other,) = gw.engines(1)
    gw.engine.drop = 2
    route = {"endpoints": [endpoint(gw.engine.url), {**endpoint(other.url), "priority": 1}], "preferred": ""}
    gw.serve(route)
    answer = gw.chat()
    assert answer.status == 200, answer.body
    assert len(gw.engine.seen) == 2 and len(other.seen) == 1
    assert gw.gateway.breakers.ejected(gw.engine.url)


def test_only_a_break_counts_as_broken_not_a_refusal_or_a_timeout():
    key = ConnectionKey("127.0.0.1", 9, False, True, None, None, None)
    assert broken_connection(aiohttp.ServerDisconnectedError())
    assert broken_connection(aiohttp.ClientOSError(32, "Can not write request body"))
    assert not broken_connection(aiohttp.ClientConnectorError(key, OSError(111, "refused")))
    assert not broken_connection(TimeoutError())
