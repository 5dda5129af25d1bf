"""Schemathesis over every operation of the OpenAPI schema: no input, valid or not, answers 5xx.

It runs in process against the WSGI app (no server, no port), as a platform admin and as a tenant
developer, with positive and negative examples. Examples are derandomized (a fixed seed per operation),
so a run is reproducible and CI is stable; a failure prints the request to replay with curl.

Half the examples (chosen by a hash of the case, not by chance) get path parameters that name objects
that exist — the demo tenant, its model and version, a region — so the views behind the 404 run too.
"""

import os
import zlib
from typing import Any

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from controlplane.wsgi import application
from tests.support.principals import mint, principal
from tests.support.registry import advance, register

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

# Small, so the whole run takes about a minute; raise it locally to search harder.
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "6"))
EXISTING = {
    "owner": "acme",
    "tenant_slug": "acme",
    "slug": "acme",
    "name": "llama-3-8b",
    "version": "1.0.0",
    "alias": "stable",
    "code": "eu-west-1",
    "username": "dave",
}


schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = application
schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=True)


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Any:
    """The WSGI handler closes the database connection after each request; the test's transaction lives
    on that connection, so do what Django's test client does and keep it open."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(world: Any, chat_model: Any, make_region: Any) -> Any:
    """Objects for the examples to find: a region, tenant acme's model with a staged version and an alias."""
    from registry.services.lifecycle import alias_move

    make_region("eu-west-1", "EU")
    actor = principal(world.alice)
    version = advance(register(chat_model, actor, "1.0.0"), actor, "staged")
    alias_move(actor=actor, model=chat_model, name="stable", version=version, reason="schemathesis")
    return world


@pytest.fixture
def bearers(seeded: Any) -> dict[str, str]:
    """A platform admin and a developer of tenant acme: every example is sent as each of them."""
    return {"admin": mint(seeded.admin), "developer": mint(seeded.dave)}


def _aim_at_existing_objects(case: Any) -> None:
    seed = zlib.crc32(repr((case.path_parameters, case.query, case.body)).encode())
    if case.path_parameters and seed % 2 == 0:
        for key in case.path_parameters:
            if key in EXISTING:
                case.path_parameters[key] = EXISTING[key]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_operation_answers_5xx(case: Any, bearers: dict[str, str]) -> None:
    _aim_at_existing_objects(case)
    for bearer in bearers.values():
        response = case.call(headers={"Authorization": f"Bearer {bearer}"})
        case.validate_response(response, checks=[not_a_server_error])
