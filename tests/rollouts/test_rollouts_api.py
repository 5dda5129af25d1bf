"""The rollouts API: who may see and act on which rollout, hostile input, idempotent starts."""

import pytest

from rollouts.models import Rollout
from rollouts.services import rollouts
from tests.support.envelope import assert_envelope
from tests.support.rollouts import drive, stage

pytestmark = pytest.mark.django_db(transaction=True)
START = {"deployment": "acme/chat", "version": "2.0.0", "steps": [{"set_weight": 20}, {"pause": {}}]}
ACTIONS = ("pause", "resume", "abort", "promote")


@pytest.fixture
def staged(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    return stage(world, make_region, tiny_model_dir)


def test_a_ci_token_starts_a_rollout_once_per_idempotency_key(world, api, staged):
    client = api(world.alice)
    first = client.post("/api/v1/rollouts/", START, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    again = client.post("/api/v1/rollouts/", START, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    assert first.status_code == 202, first.content
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    assert Rollout.objects.count() == 1
    body = first.json()
    assert body["state"] == "pending" and body["candidate"] == "2.0.0" and body["baseline"] == "1.0.0"
    assert body["waves"] == [["eu-west-1"]] and body["deployment"] == "acme/chat"
    detail = client.get(f"/api/v1/rollouts/{body['id']}/").json()
    assert detail["events"][0]["kind"] == "started" and detail["analysis_runs"] == []


def test_another_tenant_neither_sees_nor_acts(world, api, staged):
    rollout = rollouts.rollout_start(actor=staged.alice, deployment=staged.deployment, **_fields())
    bob = api(world.bob)
    assert bob.get("/api/v1/rollouts/").json()["results"] == []
    assert_envelope(bob.get(f"/api/v1/rollouts/{rollout.pk}/"), 404, "not_found")
    for action in ACTIONS:
        reply = bob.post(f"/api/v1/rollouts/{rollout.pk}/{action}/", {"reason": "mine now"}, format="json")
        assert_envelope(reply, 404, "not_found")
    assert_envelope(bob.post("/api/v1/rollouts/", START, format="json"), 404, "not_found")
    rollout.refresh_from_db()
    assert rollout.state == "pending" and Rollout.objects.count() == 1


def test_a_viewer_and_an_auditor_see_but_cannot_act(world, api, staged):
    rollout = rollouts.rollout_start(actor=staged.alice, deployment=staged.deployment, **_fields())
    for user in (world.vera, world.auditor):
        client = api(user)
        assert client.get(f"/api/v1/rollouts/{rollout.pk}/").status_code == 200
        for action in ACTIONS:
            reply = client.post(f"/api/v1/rollouts/{rollout.pk}/{action}/", {"reason": "x"}, format="json")
            assert reply.status_code == 403, (user, action, reply.content)
        assert client.post("/api/v1/rollouts/", START, format="json").status_code == 403
    rollout.refresh_from_db()
    assert rollout.state == "pending"


@pytest.mark.parametrize(
    "body",
    [
        {**START, "version": "2.0.0\x00"},
        {**START, "steps": "set_weight 50"},
        {**START, "steps": [{"set_weight": 50}, {"set_weight": 50}]},
        '{"deployment": "acme/chat", "version": "2.0.0", "steps": [{"set_weight": 1e309}]}',
        '{"deployment": "acme/chat", "version": "2.0.0", "steps": [{"set_weight": NaN}]}',
        {**START, "steps": [{"pause": {"seconds": "soon"}}]},
        {**START, "steps": [{"set_weight": 50}, {"pause": {"seconds": 30, "warmup_seconds": 30}}]},
        {**START, "steps": [{"set_weight": 50}, {"pause": {"warmup_seconds": 10}}]},
        {**START, "steps": [{"set_weight": 50}, {"pause": {"min_requests": 9, "warmup_seconds": -1}}]},
        {**START, "waves": [["eu-west-1"], []]},
        {**START, "waves": {"eu-west-1": 1}},
        {**START, "analysis": [1, 2]},
        {**START, "strategy": "yolo"},
        {**START, "rollback_window_seconds": "five minutes"},
        {**START, "rollback_window_seconds": -1},
        {**START, "webhook": "ftp://example.com/x"},
        {**START, "surprise": True},
        {"version": "2.0.0"},
        {**START, "model": "acme/tiny-llama"},
        {**START, "deployment": "../etc"},
        {
            **START,
            "steps": [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                []
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ],
        },
    ],
)
def test_bad_input_is_a_400_and_writes_nothing(world, api, staged, body):
    client = api(world.alice)
    if isinstance(body, str):  # JSON no client library would send
        reply = client.post("/api/v1/rollouts/", body, content_type="application/json")
    else:
        reply = client.post("/api/v1/rollouts/", body, format="json")
    assert reply.status_code == 400, reply.content
    assert set(reply.json()) == {"error"}
    assert not Rollout.objects.exists()


def test_actions_need_a_reason_where_it_matters_and_follow_the_machine(world, api, staged):
    client = api(world.alice)
    rollout_id = client.post("/api/v1/rollouts/", START, format="json").json()["id"]
    assert_envelope(client.post(f"/api/v1/rollouts/{rollout_id}/abort/", {}, format="json"), 400, "invalid")
    assert_envelope(
        client.post(f"/api/v1/rollouts/{rollout_id}/resume/", {}, format="json"), 409, "invalid_transition"
    )
    drive(Rollout.objects.get(pk=rollout_id), {"paused"})
    assert (
        client.post(f"/api/v1/rollouts/{rollout_id}/resume/", {}, format="json").json()["state"]
        == "progressing"
    )
    aborted = client.post(f"/api/v1/rollouts/{rollout_id}/abort/", {"reason": "enough"}, format="json")
    assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
    assert_envelope(
        client.post(f"/api/v1/rollouts/{rollout_id}/pause/", {}, format="json"), 409, "invalid_transition"
    )


def test_a_second_rollout_is_a_409(world, api, staged):
    client = api(world.alice)
    assert client.post("/api/v1/rollouts/", START, format="json").status_code == 202
    assert_envelope(client.post("/api/v1/rollouts/", START, format="json"), 409, "rollout_active")


def _fields() -> dict:
    return {k: v for k, v in START.items() if k != "deployment"}
