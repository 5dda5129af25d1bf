"""Billing's side of rollouts: requests mirrored to a shadow candidate and the candidate's GPUs are the
platform's evaluation cost, never a tenant's; usage records carry the serving track and TTFT; capacity is
metered per revision; the residency check judges a record by the version that served it.

No engines and no wall clock: capacity and usage are written at fixed past moments, reports are handed
``now``, metering the moment it observed (``at=``); the one API call travels to a fixed moment.
"""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from billing import reports, selectors
from billing.costing import EVALUATION
from billing.metering import record_allocation
from billing.models import BudgetAlert, CapacitySegment, GpuPrice, UsageRecord
from billing.residency import usage_outside_residency
from billing.services import evaluate_budgets, usage_ingest
from core.models import AuditEvent
from core.principal import Principal
from regions.choices import TargetPurpose, TargetRole
from regions.models import Deployment, DeploymentTarget
from regions.services.deployments import deployment_create
from registry.models import ModelVersion
from tests.support.billing import HISTORY, held, hourly_usage
from tests.support.gateway import gateway_secret
from tests.support.principals import World, principal
from tests.support.regions import tiny_version
from tests.support.rollouts import next_version

pytestmark = pytest.mark.django_db

START = HISTORY  # 2025-06-10 08:00 UTC
NOW = START + timedelta(hours=12)
SHADOW = START + timedelta(hours=2)  # the shadow rollout starts
V1, V2 = "tiny-llama@1.0.0", "tiny-llama@2.0.0"


@dataclass
class Fleet:
    chat: Deployment  # acme's own
    assistant: Deployment  # shared, used by acme and globex
    v1: ModelVersion
    v2: ModelVersion


@pytest.fixture
def fleet(world: World, make_region, tiny_model_dir, settings) -> Fleet:  # type: ignore[no-untyped-def]
    """Ten hours of 2.50 GPU time on each deployment in eu-west-1, and a request per hour of each user."""
    settings.BILLING_TOKENS_PER_GPU_HOUR = {"default": 1000}  # weighted tokens one GPU serves in an hour
    region = make_region("eu-west-1", "EU")
    operator = principal(world.operator)
    v1 = tiny_version(operator, tiny_model_dir)
    v2 = next_version(operator, v1, "2.0.0", status="draft")
    chat = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=v1.model, version="1.0.0"
    )
    assistant = deployment_create(
        actor=operator,
        owner=world.tenant_a,
        name="assistant",
        model=v1.model,
        version="1.0.0",
        regions=["eu-west-1"],
        shared=True,
    )
    GpuPrice.objects.create(
        region=region, gpu_type="L4", hourly_price=Decimal("2.50"), effective_from=START - timedelta(days=1)
    )
    for deployment in (chat, assistant):
        held(deployment, v1, START, hours=10)
    hourly_usage(world.tenant_a, chat, START, 10, prompt=100, completion=50)
    hourly_usage(world.tenant_a, assistant, START, 10, prompt=200, completion=300)
    hourly_usage(world.tenant_b, assistant, START, 10, prompt=400, completion=100)
    return Fleet(chat, assistant, v1, v2)


def candidate(deployment: Deployment, version: ModelVersion, purpose: str) -> DeploymentTarget:
    stable = deployment.targets.get(role=TargetRole.STABLE)
    return DeploymentTarget.objects.create(
        deployment=deployment,
        region=stable.region,
        role=TargetRole.CANDIDATE,
        revision=1,
        version=version,
        purpose=purpose,
        mirror_percent=50 if purpose == TargetPurpose.EVALUATION else 0,
        traffic_percent=0 if purpose == TargetPurpose.EVALUATION else 50,
    )


def shadow(world: World, fleet: Fleet) -> None:
    """A shadow rollout of 2.0.0 on both deployments: each candidate on an evaluation GPU (3 and 4 hours),
    and requests of both tenants mirrored to it every hour."""
    for deployment, hours in ((fleet.chat, 3), (fleet.assistant, 4)):
        candidate(deployment, fleet.v2, TargetPurpose.EVALUATION)
        held(deployment, fleet.v2, SHADOW, hours, revision=1, purpose=TargetPurpose.EVALUATION)
        hourly_usage(world.tenant_a, deployment, SHADOW, hours, 300, 200, version=V2, track="mirror")
    hourly_usage(world.tenant_b, fleet.assistant, SHADOW, 4, 300, 200, version=V2, track="mirror")


def tenant_figures(world: World) -> dict[str, Any]:
    """Everything a tenant is billed or shown, and the operator's view of it, at ``NOW``."""
    start, end = reports.month_bounds("2025-06")
    month = reports.build(start, end, now=NOW)
    day = reports.build(NOW - timedelta(hours=24), NOW, now=NOW)
    slugs = [world.tenant_a.slug, world.tenant_b.slug]
    until, window = START + timedelta(hours=10), timedelta(hours=10)
    return {
        **{slug: reports.summarize(month, list(reports.GROUPS), {slug}) for slug in slugs},
        "spent": {t: v for t, v in reports.spent_by_tenant(month).items() if t != EVALUATION},
        "budgets": reports.budget_status([world.tenant_a, world.tenant_b], month),
        "idle": reports.idle_deployments(day, Decimal("1.01"), None),  # every deployment, with its saving
        "utilization": month.utilization,
        "rates": [
            selectors.usage_rates(principal(u), now=until, window=window)
            for u in (world.alice, world.operator)
        ],
        "operator": [
            row
            for row in reports.summarize(month, ["tenant", "deployment", "version"], None)
            if row["tenant"] != EVALUATION
        ],
    }


def test_tenant_cost_and_tokens_are_the_same_with_and_without_a_shadow_rollout(world, fleet):
    before = tenant_figures(world)
    # Not a trivial world: acme's own 25.00, and the shared 25.00 split 55 % used (acme 350 and globex 200
    # weighted tokens an hour of 1000), each hour's half cent of acme's going to idle by name.
    assert before["spent"] == {
        world.tenant_a.slug: Decimal("25.00") + Decimal("8.70"),
        world.tenant_b.slug: Decimal("5.00"),
        "": Decimal("11.30"),
    }
    shadow(world, fleet)
    after = tenant_figures(world)
    for key in before:
        assert after[key] == before[key], key


def test_the_evaluation_line_shows_mirrored_requests_and_evaluation_capacity(world, fleet):
    shadow(world, fleet)
    start, end = reports.month_bounds("2025-06")
    month = reports.build(start, end, now=NOW)
    assert reports.evaluation(month) == {
        "cost": Decimal("17.50"),  # (3 + 4) GPU-hours × 2.50
        "gpu_hours": Decimal("7.000"),
        "requests": 11,  # 3 + 4 of acme's, 4 of globex's
        "prompt_tokens": 3300,
        "completion_tokens": 2200,
    }
    rows = reports.summarize(month, ["tenant", "deployment", "version"], None)
    evaluation = {(r["deployment"], r["version"]): r for r in rows if r["tenant"] == EVALUATION}
    assert {key: (r["cost"], r["requests"]) for key, r in evaluation.items()} == {
        ("acme/chat", V2): (Decimal("7.50"), 3),
        ("acme/assistant", V2): (Decimal("10.00"), 8),
    }
    # Conservation: tenants, idle and evaluation together are every GPU-hour held, to the cent.
    assert sum((line.cost for line in month.lines), Decimal(0)) == Decimal("67.50")  # 27 h × 2.50
    assert reports.summarize(month, ["tenant"], {world.tenant_a.slug})[0]["tenant"] == world.tenant_a.slug


def test_the_api_shows_the_evaluation_line_to_operators_only(world, fleet, api):
    shadow(world, fleet)
    url = "/api/v1/costs/?month=2025-06&group_by=tenant"
    with time_machine.travel(NOW, tick=False):  # the API reads the clock at its edge
        operator, mine = api(world.operator).get(url).json(), api(world.alice).get(url).json()
        csv = api(world.alice).get(url + "&export=csv").content.decode()
    assert operator["evaluation"]["cost"] == "17.50" and operator["evaluation"]["requests"] == 11
    assert {r["tenant"]: r["cost"] for r in operator["rows"]}[EVALUATION] == "17.50"
    assert "evaluation" not in mine and [r["tenant"] for r in mine["rows"]] == [world.tenant_a.slug]
    assert mine["total"] == "33.70" and EVALUATION not in csv
    mirrored = [r for r in api(world.alice).get("/api/v1/usage/").json() if r["track"] == "mirror"]
    assert len(mirrored) == 7  # a tenant still sees where copies of its requests went


def test_a_shadow_rollout_never_pushes_a_tenant_over_its_budget(world, fleet):
    spent = tenant_figures(world)["spent"][world.tenant_a.slug]
    tenant = world.tenant_a
    tenant.monthly_budget, tenant.budget_hard_limit = spent + Decimal("1.00"), True
    tenant.save()
    shadow(world, fleet)  # 7.50 of evaluation GPU on acme's own deployment alone
    assert sorted(a.threshold for a in evaluate_budgets(now=NOW)) == [50, 80]
    assert selectors.over_budget(now=NOW) == set()
    assert not BudgetAlert.objects.filter(threshold=100).exists()


def test_a_canary_on_a_shared_deployment_splits_one_hours_tokens_over_both_revisions(world, fleet):
    """Stable and candidate both serve (a canary): one hour's tokens are judged against both revisions'
    GPUs together; judging each segment alone would bill the hour's tokens once per segment."""
    candidate(fleet.assistant, fleet.v2, TargetPurpose.SERVING)
    held(fleet.assistant, fleet.v2, START, hours=10, revision=1)
    hourly_usage(world.tenant_a, fleet.assistant, START, 10, 200, 300, version=V2, track="candidate")
    start, end = reports.month_bounds("2025-06")
    month = reports.build(start, end, now=NOW)
    shared = [line for line in month.lines if line.deployment == "acme/assistant"]
    cost: dict[str, Decimal] = {}
    for line in shared:
        cost[line.tenant] = cost.get(line.tenant, Decimal(0)) + line.cost
    # Per hour 2 GPUs serve 2000; acme used 2 × (50 + 300), globex 100 + 100: 45 % of 5.00 an hour.
    assert cost == {"acme": Decimal("17.50"), "globex": Decimal("5.00"), "": Decimal("27.50")}
    assert month.utilization[("acme/assistant", "eu-west-1")] == Decimal("0.45")
    by_version = reports.summarize(month, ["tenant", "deployment", "version"], {"acme"})
    assert {(r["deployment"], r["version"]): r["requests"] for r in by_version} == {
        ("acme/chat", V1): 10,
        ("acme/assistant", V1): 10,
        ("acme/assistant", V2): 10,  # what the candidate served is the tenant's, and billed
    }


# Usage ingestion: the track and TTFT of each record, refused whole when wrong.


def record(tenant: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_id": uuid.uuid4().hex,
        "tenant": tenant,
        "region": "eu-west-1",
        "version": V1,
        "status": 200,
        "latency_ms": 40.0,
        "started_at": "2026-11-29T10:00:00+00:00",
        **extra,
    }


def test_usage_carries_its_track_and_time_to_first_token(world, api):
    records = [
        record("acme", track="candidate", ttft_ms=12.5, version=V2),
        record("acme", track="mirror", ttft_ms=0, version=V2),
        record("acme", track="stable", ttft_ms="7"),
        record("acme", ttft_ms=None),  # no first byte ever came
        record("acme"),  # a gateway from before rollouts
    ]
    reply = api(secret=gateway_secret(world)).post("/api/v1/usage/", {"records": records}, format="json")
    assert reply.status_code == 200 and reply.json() == {"accepted": 5, "duplicates": 0}
    stored = {r.request_id: (r.track, r.ttft_ms) for r in UsageRecord.objects.all()}
    assert [stored[r["request_id"]] for r in records] == [
        ("candidate", 12.5),
        ("mirror", 0.0),
        ("stable", 7.0),
        ("stable", None),
        ("stable", None),
    ]
    traced = api(world.alice).get(f"/api/v1/usage/{records[0]['request_id']}/").json()
    assert (traced["track"], traced["ttft_ms"]) == ("candidate", 12.5)


@pytest.mark.parametrize(
    "bad",
    [
        {"track": "shadow"},
        {"track": "MIRROR"},
        {"track": ""},
        {"track": 1},
        {"track": ["mirror"]},
        {"track": "mirror\x00"},
        {"ttft_ms": "fast"},
        {"ttft_ms": "12\x00"},
        {"ttft_ms": True},
        {"ttft_ms": [1]},
        {"ttft_ms": -0.5},
        {"ttft_ms": "nan"},
        {"ttft_ms": "inf"},
        {"ttft_ms": "-inf"},
        {"ttft_ms": 1e300},
        {"ttft_ms": 86_400_001},
        {"trace_id": "not-a-trace"},
        {"trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736"},
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e47360"},
        {"trace_id": 7},
        {"degraded": "because"},
        {"degraded": ["capacity"]},
        {"served_model_name": "small\x00"},
    ],
)
def test_a_bad_track_or_ttft_refuses_the_whole_batch(world, api, bad):
    batch = {"records": [record("acme"), record("acme", **bad)]}
    reply = api(secret=gateway_secret(world)).post("/api/v1/usage/", batch, format="json")
    assert reply.status_code == 400, reply.content
    assert reply.json()["error"]["code"] and "records[1]" in reply.json()["error"]["message"]
    assert UsageRecord.objects.count() == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_json_number_is_refused_too(world, api, literal):
    body = json.dumps({"records": [record("acme")]})[:-3] + f', "ttft_ms": {literal}}}]}}'
    reply = api(secret=gateway_secret(world)).post("/api/v1/usage/", body, content_type="application/json")
    assert reply.status_code == 400, reply.content
    assert "error" in reply.json() and UsageRecord.objects.count() == 0


# Capacity per revision.


def segments(deployment: Deployment) -> list[tuple[Any, ...]]:
    return [
        (s.revision, s.version.version, s.purpose, s.gpus, s.started_at, s.ended_at)
        for s in CapacitySegment.objects.filter(deployment=deployment).order_by("revision", "started_at")
    ]


def moments(count: int) -> list[datetime]:
    return [START + timedelta(minutes=10 * n) for n in range(count)]


def test_a_candidate_gets_its_own_segments_as_it_comes_changes_purpose_and_goes(world, fleet):
    chat, t = fleet.chat, moments(6)
    CapacitySegment.objects.filter(deployment=chat).delete()
    stable = chat.targets.get()
    record_allocation(stable, 1, at=t[0])
    shadowing = candidate(chat, fleet.v2, TargetPurpose.EVALUATION)
    record_allocation(shadowing, 1, at=t[1])
    record_allocation(stable, 1, at=t[2])  # unchanged, both: nothing written
    record_allocation(shadowing, 1, at=t[2])
    assert segments(chat) == [
        (0, "1.0.0", "serving", 1, t[0], None),
        (1, "2.0.0", "evaluation", 1, t[1], None),  # the candidate's own version, not the deployment's
    ]
    shadowing.purpose = TargetPurpose.SERVING  # the shadow passed: the candidate takes traffic
    shadowing.save()
    record_allocation(shadowing, 1, at=t[3])
    record_allocation(shadowing, 2, at=t[4])  # scaled up
    record_allocation(shadowing, 0, at=t[5])  # rolled back: the reconciler saw its workload gone
    assert segments(chat) == [
        (0, "1.0.0", "serving", 1, t[0], None),  # the stable revision ran on, untouched
        (1, "2.0.0", "evaluation", 1, t[1], t[3]),
        (1, "2.0.0", "serving", 1, t[3], t[4]),
        (1, "2.0.0", "serving", 2, t[4], t[5]),
    ]


def test_a_promotion_keeps_both_segments_and_a_vanished_revision_is_closed(world, fleet):
    chat, t = fleet.chat, moments(4)
    CapacitySegment.objects.filter(deployment=chat).delete()
    stable, canary = chat.targets.get(), candidate(chat, fleet.v2, TargetPurpose.SERVING)
    record_allocation(stable, 1, at=t[0])
    record_allocation(canary, 1, at=t[0])
    # Promoted: the deployment runs 2.0.0, the candidate is its stable revision, the old one drains.
    Deployment.objects.filter(pk=chat.pk).update(version=fleet.v2)
    DeploymentTarget.objects.filter(pk=stable.pk).update(role=TargetRole.RETIRING, version=fleet.v1)
    DeploymentTarget.objects.filter(pk=canary.pk).update(role=TargetRole.STABLE, version=None)
    retiring, promoted = (DeploymentTarget.objects.get(pk=pk) for pk in (stable.pk, canary.pk))
    record_allocation(retiring, 1, at=t[1])
    record_allocation(promoted, 1, at=t[1])
    assert segments(chat) == [(0, "1.0.0", "serving", 1, t[0], None), (1, "2.0.0", "serving", 1, t[0], None)]
    retiring.delete()  # its row went without a last observation at zero GPUs
    record_allocation(promoted, 1, at=t[2])
    assert segments(chat) == [(0, "1.0.0", "serving", 1, t[0], t[2]), (1, "2.0.0", "serving", 1, t[0], None)]


@pytest.mark.django_db(transaction=True)
def test_existing_segments_become_revision_0_serving_their_owner(world, fleet):
    executor = MigrationExecutor(connection)
    executor.migrate([("billing", "0004_usage_client_request_id")])
    old = executor.loader.project_state(("billing", "0004_usage_client_request_id")).apps
    segment = old.get_model("billing", "CapacitySegment").objects.create(
        deployment_id=fleet.chat.pk,
        version_id=fleet.v1.pk,
        region_id=fleet.chat.targets.get().region_id,
        gpu_type="L4",
        gpus=1,
        started_at=START,
    )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    migrated = CapacitySegment.objects.get(pk=segment.pk)
    assert (migrated.revision, migrated.purpose, migrated.ended_at) == (0, "serving", None)


# Residency, judged by the version that served.


def test_the_residency_check_judges_a_record_by_the_version_it_names(world, fleet):
    ModelVersion.objects.filter(pk=fleet.v2.pk).update(allowed_jurisdictions=["US"])
    served = {
        name: UsageRecord(
            request_id=name,
            tenant=world.tenant_a,
            region="eu-west-1",
            deployment=fleet.chat,
            version=version,
            track=track,
        )
        for name, version, track in [
            ("stable", V1, "stable"),
            ("canary", V2, "candidate"),
            ("mirror", V2, "mirror"),
            ("unknown", "tiny-llama@9.9.9", "stable"),  # not found: judged by the deployment's version
            ("unnamed", "", "stable"),
        ]
    }
    flagged = {record.request_id: why for record, why in usage_outside_residency(served.values())}
    assert set(flagged) == {"canary", "mirror"}
    assert "tiny-llama@2.0.0 may not be served in EU" in flagged["canary"]

    ModelVersion.objects.filter(pk=fleet.v1.pk).update(allowed_jurisdictions=["US"])
    ModelVersion.objects.filter(pk=fleet.v2.pk).update(allowed_jurisdictions=["EU", "US"])
    flagged = {record.request_id: why for record, why in usage_outside_residency(served.values())}
    assert set(flagged) == {"stable", "unknown", "unnamed"}

    records = [record("acme", deployment=fleet.chat.pk, version=V1, track="candidate")]
    records.append(record("acme", deployment=fleet.chat.pk, version=V2, track="candidate"))
    usage_ingest(actor=Principal.system("gateway"), records=records)
    (event,) = AuditEvent.objects.filter(action="usage.outside_residency")
    assert event.message.startswith("1 request(s)") and records[0]["request_id"] in event.message
