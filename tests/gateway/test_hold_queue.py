"""The hold queue in process (gateway/hold.py), against a fake engine and a fake control plane: many held
requests make one activation call at a time, each is released only by its own tenant's route, and a newer
table judges a released request again (a model gone, a token revoked). The same queue with a real gateway
process and the live control plane: tests/gateway/test_hold.py."""

import asyncio
import copy
import json
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from gateway.hold import ACTIVATION_RETRY_SECONDS
from tests.support.gateway_harness import TOKENS, Answer, GatewayWorld, digest, endpoint

AT_ZERO = {
    "endpoints": [],
    "preferred": "eu-west-1",
    "unavailable": "no healthy region ... : eu-west-1 is at zero replicas and wakes on a request",
    "activatable": {"deployment": 1, "region": "eu-west-1"},
}


@pytest.fixture
def world(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path, hold_timeout_seconds=20.0)
    world.serve(copy.deepcopy(AT_ZERO))
    yield world
    world.close()


class Client:
    """One chat request whose client stays connected (ASGI receive() blocks, as uvicorn's does once the
    body is read) until ``leave()``."""

    def __init__(self, world: GatewayWorld, tenant: str = "acme", model: str = "chat"):
        self.left = threading.Event()
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        headers = [(b"authorization", f"Bearer {TOKENS[tenant]}".encode())]
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
        self.answer: Future[Answer] = asyncio.run_coroutine_threadsafe(
            self._call(world, scope, body), world.loop
        )

    def leave(self) -> None:
        self.left.set()

    async def _call(self, world: GatewayWorld, scope: dict[str, Any], body: bytes) -> Answer:
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        status, headers, parts = 0, {}, []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            while not self.left.is_set():
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = {k.decode(): v.decode() for k, v in message["headers"]}
            else:
                parts.append(message.get("body", b""))

        await world.gateway.handle(scope, receive, send)
        return Answer(status, headers, b"".join(parts))


def install(world: GatewayWorld, table: dict[str, Any]) -> None:
    """A new table generation arrives (what the long-poll does)."""

    async def arrive() -> None:
        routes = world.gateway.routes
        routes.install(table, f"etag-{routes.generation + 1}", routes.generation + 1)

    world.run(arrive())


def holds(world: GatewayWorld) -> dict[str, int]:
    return world.run(_stats(world))  # type: ignore[no-any-return]


async def _stats(world: GatewayWorld) -> dict[str, int]:
    return world.gateway.holds.stats()


def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_held_requests_make_one_activation_at_a_time_and_only_their_own_route_releases_them(world):
    started = time.monotonic()
    clients = [Client(world) for _ in range(5)]
    until(lambda: holds(world)["held_now"] == 5)
    until(lambda: world.control.activations)
    assert (
        world.control.activations[0]["tenant"] == "acme" and world.control.activations[0]["model"] == "chat"
    )

    # globex's route changes, acme's is still at zero: nothing is released, nothing goes anywhere else.
    table = copy.deepcopy(world.control.table)
    table["tenants"]["globex"]["models"]["chat"] = {
        "endpoints": [endpoint(world.engine.url)],
        "preferred": "",
    }
    install(world, table)
    time.sleep(0.2)
    assert holds(world)["held_now"] == 5 and not world.engine.seen

    table["tenants"]["acme"]["models"]["chat"] = {"endpoints": [endpoint(world.engine.url)], "preferred": ""}
    install(world, table)
    answers = [c.answer.result(timeout=10) for c in clients]
    assert [a.status for a in answers] == [200] * 5 and len(world.engine.seen) == 5
    assert all(int(a.headers["x-held-ms"]) >= 0 for a in answers)
    elapsed = time.monotonic() - started
    assert 1 <= len(world.control.activations) <= 1 + elapsed // ACTIVATION_RETRY_SECONDS
    stats = holds(world)
    assert (stats["held"], stats["released"], stats["held_now"]) == (5, 5, 0)


def test_a_route_without_a_region_to_wake_is_refused_at_once(world):
    world.serve({"endpoints": [], "preferred": "", "unavailable": "outside acme's residency"})
    answer = world.chat()
    assert answer.status == 503 and answer.json()["error"]["code"] == "residency_unavailable"
    assert holds(world)["held"] == 0 and not world.control.activations


def test_a_held_request_is_judged_again_by_the_table_that_releases_it(world):
    waiting = [Client(world), Client(world)]
    until(lambda: holds(world)["held_now"] == 2)
    table = copy.deepcopy(world.control.table)
    del table["tenants"]["acme"]["models"]["chat"]  # the deployment was deleted meanwhile
    install(world, table)
    assert [c.answer.result(timeout=10).status for c in waiting] == [404, 404]

    table["tenants"]["acme"]["models"]["chat"] = copy.deepcopy(AT_ZERO)
    install(world, table)
    held = Client(world)
    until(lambda: holds(world)["held_now"] == 1)
    table["tenants"]["acme"]["models"]["chat"] = {"endpoints": [endpoint(world.engine.url)], "preferred": ""}
    del table["credentials"][digest(TOKENS["acme"])]  # its token was revoked while it waited
    install(world, table)
    answer = held.answer.result(timeout=10)
    assert answer.status == 401 and not world.engine.seen


def test_a_client_that_leaves_is_dropped_and_the_others_stay(world):
    stays, leaves = Client(world), Client(world)
    until(lambda: holds(world)["held_now"] == 2)
    leaves.leave()
    until(lambda: holds(world)["dropped_disconnected"] == 1)
    assert holds(world)["held_now"] == 1 and not stays.answer.done()
    stays.leave()
    until(lambda: holds(world)["held_now"] == 0)


def test_a_held_request_whose_route_stops_being_wakeable_is_answered_at_once_not_at_the_timeout(world):
    held = Client(world)
    until(lambda: holds(world)["held_now"] == 1)
    table = copy.deepcopy(world.control.table)
    table["tenants"]["acme"]["models"]["chat"] = {
        "endpoints": [],
        "preferred": "",
        "unavailable": "eu-west-1 is not ready",  # paused by hand meanwhile: nothing will wake it
    }
    install(world, table)
    answer = held.answer.result(timeout=5)
    assert answer.status == 503 and answer.json()["error"]["code"] == "residency_unavailable"
    assert not world.engine.seen
