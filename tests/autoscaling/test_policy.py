"""Every policy field validated, each refusal naming its field: the pure parser, then the service's checks
that need the deployment (its regions, its tenant's GPU quota)."""

import math

import pytest

from autoscaling.models import AutoscalingPolicy
from autoscaling.policy import FIELDS, Policy, effective, parse, parse_overrides
from autoscaling.services.policies import policy_delete, policy_get, policy_set
from core.errors import NotFound, ValidationFailed
from core.models import AuditEvent
from tests.support.autoscaling import deploy
from tests.support.principals import principal
from tests.support.regions import tiny_version

BASE = {"running": 4}


def refusal(raw: object, **kw: object) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        parse(raw, **kw)  # type: ignore[arg-type]
    return caught.value


def test_a_valid_policy_keeps_the_defaults_it_does_not_name():
    policy = parse({"running": 4, "waiting": 2.5, "max_replicas": 8})
    assert policy == Policy(running=4.0, waiting=2.5, max_replicas=8)
    assert isinstance(policy.running, float) and isinstance(policy.max_replicas, int)
    assert parse({"kv_cache": 1, "min_replicas": 0, "max_replicas": 1}).kv_cache == 1.0
    assert parse({"running": 4, "max_replicas": 8.0}).max_replicas == 8  # a whole float is a whole number
    assert parse({"running": 4, "waiting": None}).waiting is None


NOT_NUMBERS = ["4", True, False, None, [], {}, "NaN"]
NON_FINITE = [math.nan, math.inf, -math.inf]
HUGE = 10**400  # JSON allows any integer: too large for a float


@pytest.mark.parametrize("name", sorted(FIELDS))
@pytest.mark.parametrize("value", [*NOT_NUMBERS, *NON_FINITE, HUGE, -(10**400)])
def test_every_field_refuses_what_is_not_a_finite_number_in_range(name, value):
    if value is None and name in ("waiting", "running", "kv_cache", "ttft_p95_seconds"):
        return  # a target may be cleared
    raw = {**BASE, name: value} if name != "running" else {"waiting": 1, name: value}
    error = refusal(raw)
    assert error.detail == {"field": name} and name in str(error)


@pytest.mark.parametrize(
    ("raw", "field", "needle"),
    [
        ({"running": 0}, "running", "at least 0.001"),
        ({"waiting": -1}, "waiting", "at least 0.001"),
        ({"ttft_p95_seconds": -0.5}, "ttft_p95_seconds", "at least 0.001"),
        ({"running": 5e-324}, "running", "at least 0.001"),
        ({"kv_cache": 1.01}, "kv_cache", "at most 1"),
        ({}, "metrics", "at least one target"),
        ({"running": None}, "metrics", "at least one target"),
        ({**BASE, "min_replicas": 3, "max_replicas": 2}, "max_replicas", "at least min_replicas"),
        ({**BASE, "min_replicas": 0, "max_replicas": 0}, "max_replicas", "at least min_replicas"),
        ({**BASE, "max_replicas": 65}, "max_replicas", "64"),
        ({**BASE, "min_replicas": -1}, "min_replicas", "between 0 and 64"),
        ({**BASE, "max_replicas": 2.5}, "max_replicas", "whole number"),
        ({**BASE, "tolerance": 1}, "tolerance", "below 1"),
        ({**BASE, "tolerance": -0.1}, "tolerance", "at least 0"),
        ({**BASE, "scale_up_stabilization_seconds": 3601}, "scale_up_stabilization_seconds", "3600"),
        ({**BASE, "scale_down_stabilization_seconds": -1}, "scale_down_stabilization_seconds", "3600"),
        ({**BASE, "window_seconds": 14}, "window_seconds", "between 15 and 1800"),
        ({**BASE, "scale_up_period_seconds": 1801}, "scale_up_period_seconds", "1800"),
        ({**BASE, "scale_down_period_seconds": 0}, "scale_down_period_seconds", "1800"),
        ({**BASE, "scale_up_percent": 0}, "scale_up_percent", "between 1 and 1000"),
        ({**BASE, "scale_up_replicas": 1001}, "scale_up_replicas", "1000"),
        ({**BASE, "scale_down_replicas": 0}, "scale_down_replicas", "between 1 and 1000"),
        ({**BASE, "idle_seconds": 59}, "idle_seconds", "60 seconds and 7 days"),
        ({**BASE, "idle_seconds": 7 * 86_400 + 1}, "idle_seconds", "7 days"),
        ({**BASE, "colour": "red"}, "colour", "not a policy field"),
        ({**BASE, "mode": "hpa"}, "mode", "not a policy field"),  # mode is the service's, not a field
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(raw, field, needle):
    error = refusal(raw)
    assert error.detail == {"field": field}
    assert needle in str(error)


def test_a_policy_that_is_not_an_object_is_refused():
    for raw in ([], "running=4", 4, None):
        assert refusal(raw).detail == {"field": "policy"}


def test_overrides_are_validated_merged_with_the_policy_and_named_by_their_path():
    base = parse({"running": 4, "min_replicas": 2, "max_replicas": 6})
    assert parse_overrides({"eu-west-1": {"max_replicas": 3}}, base, {"eu-west-1"}) == {
        "eu-west-1": {"max_replicas": 3}
    }
    with pytest.raises(ValidationFailed) as caught:
        parse_overrides({"eu-west-1": {"max_replicas": 1}}, base, {"eu-west-1"})  # below the merged min 2
    assert caught.value.detail == {"field": "overrides.eu-west-1.max_replicas"}
    assert str(caught.value).startswith("overrides.eu-west-1.max_replicas ")
    with pytest.raises(ValidationFailed) as caught:
        parse_overrides({"eu-west-1": {"waiting": "lots"}}, base, {"eu-west-1"})
    assert caught.value.detail == {"field": "overrides.eu-west-1.waiting"}
    assert "overrides.eu-west-1.waiting must be a number" in str(caught.value)
    with pytest.raises(ValidationFailed) as caught:
        parse_overrides({"eu-west-1": ["max_replicas", 3]}, base, {"eu-west-1"})
    assert caught.value.detail == {"field": "overrides.eu-west-1"}
    assert str(caught.value) == "overrides.eu-west-1 must be an object."
    with pytest.raises(ValidationFailed) as caught:
        parse_overrides({"us-east-1": {"max_replicas": 3}}, base, {"eu-west-1"})
    assert caught.value.detail == {"field": "overrides"} and "us-east-1" in str(caught.value)
    with pytest.raises(ValidationFailed) as caught:
        parse_overrides([{"max_replicas": 3}], base, {"eu-west-1"})
    assert caught.value.detail == {"field": "overrides"}


def test_a_regions_effective_policy_is_the_policy_with_its_overrides():
    spec = parse({"running": 4, "max_replicas": 6}).as_dict()
    overrides = {"eu-west-1": {"max_replicas": 2, "waiting": 1}}
    assert effective(spec, overrides, "eu-west-1") == Policy(running=4.0, waiting=1.0, max_replicas=2)
    assert effective(spec, overrides, "eu-central-1") == Policy(running=4.0, max_replicas=6)


# -- the service: regions, quota, audit -------------------------------------------------------------------


@pytest.fixture
def chat(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU", gpus=8)
    make_region("eu-central-1", "EU", gpus=8)
    version = tiny_version(principal(world.alice), tiny_model_dir, owner=world.tenant_a)
    return deploy(principal(world.alice), version, ["eu-west-1"])


@pytest.mark.django_db
def test_overrides_may_only_name_the_regions_the_deployment_runs_in(world, chat):
    alice = principal(world.alice)
    policy_set(actor=alice, deployment=chat, body={"running": 4, "overrides": {"eu-west-1": {"waiting": 2}}})
    with pytest.raises(ValidationFailed) as caught:
        policy_set(actor=alice, deployment=chat, body={"running": 4, "overrides": {"eu-central-1": {}}})
    assert caught.value.detail == {"field": "overrides"} and "does not run" in str(caught.value)


@pytest.mark.django_db
def test_max_replicas_beyond_the_tenants_gpu_quota_is_refused(world, chat):
    world.tenant_a.max_gpus = 4
    world.tenant_a.save()
    alice = principal(world.alice)
    policy_set(actor=alice, deployment=chat, body={"running": 4, "max_replicas": 4})
    for body in (
        {"running": 4, "max_replicas": 5},
        {"running": 4, "max_replicas": 2, "overrides": {"eu-west-1": {"max_replicas": 5}}},
    ):
        with pytest.raises(ValidationFailed) as caught:
            policy_set(actor=alice, deployment=chat, body=body)
        assert caught.value.detail == {"field": "max_replicas"} and "quota of 4" in str(caught.value)
    assert AutoscalingPolicy.objects.get().spec["max_replicas"] == 4  # the refused ones wrote nothing


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"running": 4, "mode": "yolo"}, "mode"),
        ({"running": 4, "mode": ["hpa"]}, "mode"),
        ({"running": 4, "enabled": "yes"}, "enabled"),
        ({"running": 4, "enabled": 1}, "enabled"),
        ({"running": 4, "overrides": None}, "overrides"),
        (["running", 4], "policy"),
    ],
)
def test_the_services_own_fields_are_validated(world, chat, body, field):
    with pytest.raises(ValidationFailed) as caught:
        policy_set(actor=principal(world.alice), deployment=chat, body=body)
    assert caught.value.detail == {"field": field}


@pytest.mark.django_db
def test_set_replace_get_and_delete_are_audited_and_delete_keeps_the_replicas(world, chat):
    alice = principal(world.alice)
    policy_set(actor=alice, deployment=chat, body={"running": 4, "max_replicas": 6})
    policy_set(actor=alice, deployment=chat, body={"waiting": 2})  # a PUT: running is gone, max back to 4
    found = policy_get(alice, chat)
    assert found.spec == Policy(waiting=2.0).as_dict() and found.updated_by_name == alice.name
    policy_delete(actor=alice, deployment=chat)
    with pytest.raises(NotFound):
        policy_get(alice, chat)
    with pytest.raises(NotFound):
        policy_delete(actor=alice, deployment=chat)
    actions = list(
        AuditEvent.objects.filter(action__startswith="autoscaling.")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == ["autoscaling.policy_set", "autoscaling.policy_set", "autoscaling.policy_deleted"]
    chat.refresh_from_db()
    assert chat.targets.get().desired_replicas == 1
