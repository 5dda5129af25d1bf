"""The activation a gateway asks for when it holds requests for a route at zero: it wakes exactly the region
the published route table offers, once, and refuses everything else with the error envelope."""

import pytest

from autoscaling.models import ScalingDecision
from core.models import AuditEvent
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create, deployment_scale
from registry.models import RegisteredModel
from routing import services
from tests.support.gateway import gateway_secret
from tests.support.principals import principal
from tests.support.regions import tiny_version
from tests.support.scale_from_zero import idle_to_zero

pytestmark = pytest.mark.django_db
URL = "/api/v1/routing/activations/"


@pytest.fixture
def at_zero(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    """acme's `chat` in eu-west-1, idled to zero, and the table published with it activatable."""
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=["eu-west-1"],
    )
    idle_to_zero(deployment, "eu-west-1")
    route = services.publish().body["tenants"]["acme"]["models"]["chat"]
    assert route["activatable"] == {"deployment": deployment.pk, "region": "eu-west-1"}
    return deployment


@pytest.fixture
def gateway(world, api):  # type: ignore[no-untyped-def]
    return api(secret=gateway_secret(world))


def activations(deployment) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    audits = AuditEvent.objects.filter(action="deployment.autoscaled", actor_name="gateway").count()
    return audits, ScalingDecision.objects.filter(deployment=deployment, kind="activate").count()


def test_a_gateway_wakes_the_offered_region_once_however_often_it_asks(at_zero, gateway):
    first = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 3}, format="json")
    assert first.status_code == 202, first.json()
    assert first.json() == {"deployment": at_zero.pk, "region": "eu-west-1", "replicas": 1, "woke": True}
    target = DeploymentTarget.objects.get(deployment=at_zero)
    assert target.desired_replicas == 1 and target.wakes_on_request  # held for until it serves
    decision = ScalingDecision.objects.get(deployment=at_zero, kind="activate")
    assert (decision.from_replicas, decision.to_replicas) == (0, 1)
    assert decision.reason == "3 request(s) held at a gateway" and decision.signals == {"held_requests": 3}
    assert activations(at_zero) == (1, 1)

    again = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 5}, format="json")
    assert again.status_code == 202 and again.json()["woke"] is False and again.json()["replicas"] == 1
    assert activations(at_zero) == (1, 1)  # starting already: nothing written

    table = services.publish()  # starting: new requests are still held, not refused
    assert table.body["tenants"]["acme"]["models"]["chat"]["activatable"]["region"] == "eu-west-1"
    late = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 5}, format="json")
    assert late.status_code == 202 and late.json()["woke"] is False
    assert activations(at_zero) == (1, 1)


def test_an_activation_from_a_table_older_than_a_residency_change_wakes_nothing(world, at_zero, gateway):
    world.tenant_a.residency = ["CH"]  # narrowed since the table was published
    world.tenant_a.save()
    refused = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 1}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "residency"
    assert DeploymentTarget.objects.get(deployment=at_zero).desired_replicas == 0
    assert activations(at_zero) == (0, 0)


def test_a_deployment_paused_by_hand_or_served_is_not_activatable(world, at_zero, gateway):
    deployment_scale(actor=principal(world.alice), deployment=at_zero, replicas=0)  # a person pauses it
    stale = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 1}, format="json")
    assert stale.status_code == 409 and "paused" in stale.json()["error"]["message"]
    services.publish()
    paused = gateway.post(URL, {"tenant": "acme", "model": "chat", "held": 1}, format="json")
    assert paused.status_code == 409 and paused.json()["error"]["code"] == "not_activatable"
    assert DeploymentTarget.objects.get(deployment=at_zero).desired_replicas == 0
    assert activations(at_zero) == (0, 0)


def test_unknown_tenants_and_models_are_404_and_a_name_never_reaches_another_tenant(at_zero, gateway):
    for body in (
        {"tenant": "initech", "model": "chat", "held": 1},
        {"tenant": "acme", "model": "nope", "held": 1},
        {"tenant": "globex", "model": "chat", "held": 1},  # acme's model name, asked for globex
    ):
        reply = gateway.post(URL, body, format="json")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found", body
    assert DeploymentTarget.objects.get(deployment=at_zero).desired_replicas == 0


def test_only_a_gateways_token_may_activate(world, at_zero, api):
    body = {"tenant": "acme", "model": "chat", "held": 1}
    for user in (world.alice, world.bob, world.operator):  # the tenant's own admin too
        reply = api(user).post(URL, body, format="json")
        assert reply.status_code == 403 and reply.json()["error"]["detail"]["scope"] == "gateway:sync"
    assert api().post(URL, body, format="json").status_code == 401
    assert DeploymentTarget.objects.get(deployment=at_zero).desired_replicas == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": 5, "model": "chat", "held": 1}, "tenant"),
        ({"tenant": "acme", "model": ["chat"], "held": 1}, "model"),
        ({"tenant": "acme", "model": "chat", "held": "3"}, "held"),
        ({"tenant": "acme", "model": "chat", "held": 2.0}, "held"),
        ({"tenant": "acme", "model": "chat", "held": True}, "held"),
        ({"tenant": "acme", "model": "chat", "held": 0}, "held"),
        ({"tenant": "acme", "model": "chat", "held": None}, "held"),
        ({"tenant": "acme", "model": "chat"}, "held"),
        ({"tenant": "a" * 100_000, "model": "chat", "held": 1}, "tenant"),
        ({"tenant": "acme", "model": "m" * 101, "held": 1}, "model"),
        ({"tenant": "", "model": "chat", "held": 1}, "tenant"),
        ({"tenant": "acme", "model": "chat", "held": 1, "region": "us-east-1"}, "region"),
        ({"tenant": "acme", "model": "ch\x00at", "held": 1}, "model"),
        (["acme", "chat", 1], "non_field_errors"),
        ("acme", "non_field_errors"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(at_zero, gateway, body, field):  # type: ignore[no-untyped-def]
    reply = gateway.post(URL, body, format="json")
    assert reply.status_code == 400, reply.content
    assert field in reply.json()["error"]["message"]
    assert DeploymentTarget.objects.get(deployment=at_zero).desired_replicas == 0


def test_bodies_that_are_not_json_objects_are_400(at_zero, gateway):
    for raw in (b"", b"{", b"null", b"[]"):
        reply = gateway.generic("POST", URL, raw, content_type="application/json")
        assert reply.status_code == 400, (raw, reply.content)


def test_a_shared_deployment_wakes_only_for_a_tenant_whose_residency_it_is_in(
    world, make_region, tiny_model_dir, gateway
):
    """A platform deployment in the US, idle: offered to globex (US), never to acme (EU, CH) for whom the
    table lists it as outside residency; acme's held requests cannot wake it."""
    make_region("us-east-1", "US")
    tiny_version(principal(world.operator), tiny_model_dir)
    catalog = RegisteredModel.objects.get(name="tiny-llama", owner=None)
    shared = deployment_create(
        actor=principal(world.operator),
        owner=world.tenant_b,
        name="assistant",
        model=catalog,
        version="1.0.0",
        regions=["us-east-1"],
        shared=True,
    )
    idle_to_zero(shared, "us-east-1")
    tenants = services.publish().body["tenants"]
    assert "activatable" not in tenants["acme"]["models"]["assistant"]
    assert "outside acme's residency" in tenants["acme"]["models"]["assistant"]["unavailable"]
    refused = gateway.post(URL, {"tenant": "acme", "model": "assistant", "held": 1}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_activatable"
    assert DeploymentTarget.objects.get(deployment=shared).desired_replicas == 0
    woken = gateway.post(URL, {"tenant": "globex", "model": "assistant", "held": 1}, format="json")
    assert woken.status_code == 202 and woken.json()["region"] == "us-east-1"
