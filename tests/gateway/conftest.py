"""The gateway end to end: a fleet of local engines, the live control plane and the gateway process."""

import pytest

from core.choices import Scope
from core.services.tokens import token_create
from routing import health
from tests.support.gateway import Gateway, chat_in_two_eu_regions, gateway_secret
from tests.support.gateway_harness import GatewayWorld
from tests.support.principals import principal


@pytest.fixture
def fleet(world, make_region, tiny_model_dir, live_server, tmp_path):  # type: ignore[no-untyped-def]
    """acme (EU, CH) runs `chat` in eu-west-1 (its home) and eu-central-1; a US region exists too."""
    everywhere = {"eu-west-1": "EU", "eu-central-1": "EU", "us-east-1": "US"}
    deployment, regions = chat_in_two_eu_regions(world, make_region, tiny_model_dir, everywhere)
    gateway_token = gateway_secret(world)
    invoke = {}
    for user in (world.alice, world.bob):
        _, invoke[user.username] = token_create(
            actor=principal(user),
            name="app",
            scopes=[Scope.MODELS_INVOKE, Scope.DEPLOYMENTS_READ, Scope.BILLING_READ],
        )
    health.cycle()
    gateway = Gateway(live_server.url, gateway_token, tmp_path / "routes.json", tmp_path / "gateway.log")
    yield {
        "gateway": gateway,
        "deployment": deployment,
        "regions": regions,
        "tokens": invoke,
        "live": live_server,
        "gateway_token": gateway_token,
    }
    gateway.stop()


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    """The gateway in-process with a fake engine and control plane (tests/support/gateway_harness.py)."""
    world = GatewayWorld(tmp_path)
    yield world
    world.close()
