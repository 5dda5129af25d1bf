"""The autoscaling API: a policy set, read, replaced and removed; refusals naming the field; who may see
and change which deployment's policy and decisions; idempotent PUTs; hostile input answered 400."""

import json

import pytest

from autoscaling import evaluator
from autoscaling.models import AutoscalingPolicy, ScalingDecision
from core.models import AuditEvent
from tests.support.autoscaling import NOW, autoscale, deploy, serve
from tests.support.envelope import assert_envelope
from tests.support.principals import principal
from tests.support.regions import tiny_version

pytestmark = pytest.mark.django_db
URL = "/api/v1/deployments/acme/chat/autoscaling/"
POLICY = {"running": 4, "max_replicas": 6, "overrides": {"eu-west-1": {"max_replicas": 3}}}


@pytest.fixture
def chat(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU", gpus=8)
    make_region("us-east-1", "US", gpus=8)
    alice = principal(world.alice)
    version = tiny_version(alice, tiny_model_dir, owner=world.tenant_a)
    return deploy(alice, version, ["eu-west-1"])


@pytest.fixture
def globex_chat(world, tiny_model_dir, chat):  # type: ignore[no-untyped-def]
    bob = principal(world.bob)
    return deploy(bob, tiny_version(bob, tiny_model_dir, owner=world.tenant_b), ["us-east-1"])


def test_put_get_and_delete_a_policy(world, api, chat):
    client = api(world.alice)
    assert client.get(URL).json()["policy"] is None
    put = client.put(URL, POLICY, format="json")
    assert put.status_code == 200, put.content
    body = put.json()
    assert body["policy"]["mode"] == "control_plane" and body["policy"]["enabled"] is True
    assert body["policy"]["spec"]["running"] == 4.0 and body["policy"]["spec"]["waiting"] is None
    assert body["policy"]["spec"]["scale_down_stabilization_seconds"] == 300  # a default, stated
    assert body["policy"]["overrides"] == {"eu-west-1": {"max_replicas": 3}}
    assert body["policy"]["updated_by"] == "alice"
    assert body["regions"][0]["region"] == "eu-west-1" and body["regions"][0]["replicas"] == 1
    assert body["capacity_limited"] == "" and body["decisions"] == []
    assert client.get(URL).json() == body
    assert client.put(URL, {"waiting": 2}, format="json").json()["policy"]["overrides"] == {}
    assert client.delete(URL).status_code == 204
    assert client.get(URL).json()["policy"] is None
    assert_envelope(client.delete(URL), 404, "not_found")
    assert not AutoscalingPolicy.objects.exists()


def test_the_decisions_of_a_pass_are_listed_with_the_deployment(world, api, chat):
    autoscale(principal(world.alice), chat, running=4)
    serve(chat, "eu-west-1", running=12)
    evaluator.evaluate_all(now=NOW)
    body = api(world.alice).get(URL).json()
    assert [(d["region"], d["kind"], d["to_replicas"]) for d in body["decisions"]] == [
        ("eu-west-1", "scale_up", 3)
    ]
    listed = api(world.alice).get("/api/v1/scaling-decisions/").json()["results"]
    assert [(d["deployment"], d["kind"]) for d in listed] == [("acme/chat", "scale_up")]
    assert api(world.alice).get("/api/v1/scaling-decisions/?kind=scale_down").json()["results"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"running": "4"}, "running"),
        ({"running": True}, "running"),
        ({"running": -1}, "running"),
        ({"kv_cache": 1.5}, "kv_cache"),
        ({"running": 4, "max_replicas": 2, "min_replicas": 3}, "max_replicas"),
        ({"max_replicas": 3}, "metrics"),
        ({"running": 4, "scale_down_stabilization_seconds": 99_999}, "scale_down_stabilization_seconds"),
        ({"running": 4, "surprise": 1}, "surprise"),
        ({"running": 4, "overrides": {"us-east-1": {"max_replicas": 2}}}, "overrides"),
        ({"running": 4, "overrides": {"eu-west-1": {"idle_seconds": 1}}}, "overrides.eu-west-1.idle_seconds"),
        ({"running": 4, "enabled": "true"}, "enabled"),
        ([1, 2, 3], "policy"),
    ],
)
def test_bad_policies_are_400_naming_the_field_and_write_nothing(world, api, chat, body, field):
    reply = api(world.alice).put(URL, body, format="json")
    error = assert_envelope(reply, 400, "invalid")
    assert error["detail"] == {"field": field}
    assert not AutoscalingPolicy.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="autoscaling.").exists()


@pytest.mark.parametrize(
    "raw",
    [
        '{"running": NaN}',
        '{"running": Infinity}',
        '{"running": 1e309}',
        '{"max_replicas": ' + "9" * 400 + ', "running": 4}',
        '{"running": 4, "overrides": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"running": 4, "overrides": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}",
        '{"running": 4, "mode": "hpa\\u0000"}',
        '{"running\\u0000": 4}',
        '{"running": 4, "overrides": {"eu-west-1\\u0000": {}}}',
        "not json",
        '{"running": 4',
    ],
)
def test_hostile_json_is_400_not_500(world, api, chat, raw):
    reply = api(world.alice).put(URL, raw, content_type="application/json")
    assert reply.status_code == 400, reply.content
    assert set(reply.json()) == {"error"}
    assert not AutoscalingPolicy.objects.exists()


def test_another_tenant_neither_sees_nor_changes_the_policy_or_its_decisions(world, api, chat, globex_chat):
    alice = principal(world.alice)
    autoscale(alice, chat, running=4)
    autoscale(principal(world.bob), globex_chat, running=4)
    serve(chat, "eu-west-1", running=12)
    evaluator.evaluate_all(now=NOW)
    assert ScalingDecision.objects.filter(deployment=chat).exists()
    bob = api(world.bob)
    assert_envelope(bob.get(URL), 404, "not_found")
    assert_envelope(bob.put(URL, {"running": 1}, format="json"), 404, "not_found")
    assert_envelope(bob.delete(URL), 404, "not_found")
    assert bob.get("/api/v1/scaling-decisions/").json()["results"] == []
    found = bob.get(f"/api/v1/scaling-decisions/?deployment={chat.pk}").json()
    assert found["results"] == []
    assert AutoscalingPolicy.objects.get(deployment=chat).spec["running"] == 4.0
    assert bob.get("/api/v1/deployments/globex/chat/autoscaling/").status_code == 200
    # and acme does not see globex's
    assert_envelope(api(world.alice).get("/api/v1/deployments/globex/chat/autoscaling/"), 404, "not_found")


def test_readers_see_the_policy_but_cannot_change_it(world, api, chat):
    autoscale(principal(world.alice), chat, running=4)
    for user in (world.vera, world.auditor):
        client = api(user)
        assert client.get(URL).status_code == 200
        assert client.get("/api/v1/scaling-decisions/").status_code == 200
        assert_envelope(client.put(URL, {"running": 1}, format="json"), 403, "forbidden")
        assert_envelope(client.delete(URL), 403, "forbidden")
    assert AutoscalingPolicy.objects.get().spec["running"] == 4.0


def test_a_put_with_an_idempotency_key_replays_and_refuses_another_body(world, api, chat):
    client = api(world.alice)
    first = client.put(URL, POLICY, format="json", HTTP_IDEMPOTENCY_KEY="ci-7")
    again = client.put(URL, POLICY, format="json", HTTP_IDEMPOTENCY_KEY="ci-7")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert AuditEvent.objects.filter(action="autoscaling.policy_set").count() == 1
    other = client.put(URL, {"running": 8}, format="json", HTTP_IDEMPOTENCY_KEY="ci-7")
    assert_envelope(other, 422, "idempotency_key_reused")
    assert json.loads(client.get(URL).content)["policy"]["spec"]["running"] == 4.0


@pytest.mark.parametrize("query", ["deployment=abc", "kind=bogus", "deployment=99999999999999999999999"])
def test_bad_decision_filters_are_400(world, api, chat, query):
    reply = api(world.alice).get(f"/api/v1/scaling-decisions/?{query}")
    assert reply.status_code == 400, reply.content


def test_the_decision_filter_does_not_tell_which_deployment_ids_exist(world, api, chat):
    bob = api(world.bob)
    theirs = bob.get(f"/api/v1/scaling-decisions/?deployment={chat.pk}")
    nobodys = bob.get("/api/v1/scaling-decisions/?deployment=987654")
    assert theirs.status_code == nobodys.status_code == 200
    assert theirs.json()["results"] == nobodys.json()["results"] == []
