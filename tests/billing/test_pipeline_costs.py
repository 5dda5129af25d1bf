"""Cost per pipeline stage and per pipeline: a tenant's GPU cost split over the stages its tokens came from,
adding up to the tenant, region and deployment totals to the cent; tenants see only their own stages.

No engines and no wall clock: capacity and usage sit at fixed past moments, reports are handed ``now``,
and the API calls travel to a fixed moment.
"""

import csv
import io
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import reports
from billing.models import GpuPrice, UsageRecord
from core.models import Tenant
from regions.models import Deployment
from regions.services.deployments import deployment_create
from tests.support.billing import HISTORY, held
from tests.support.principals import World, principal
from tests.support.regions import tiny_version

pytestmark = pytest.mark.django_db

START = HISTORY  # 2025-06-10 08:00 UTC
NOW = START + timedelta(hours=12)
HOURS = 10
RAG, TRIAGE = "acme/support-rag@1.0.0", "globex/triage@2.0.0"
BY_STAGE = ["tenant", "region", "deployment", "pipeline", "stage"]
MEASURES = ("cost", "gpu_hours", "requests", "cached_requests", "prompt_tokens", "completion_tokens")


@dataclass
class Fleet:
    chat: Deployment  # acme's own: its pipeline's "rewrite" stage and its direct requests
    assistant: Deployment  # shared: acme's "answer" stage, globex's "classify" stage and direct requests


def usage(  # type: ignore[no-untyped-def]
    tenant: Tenant, deployment: Deployment, pipeline: str, stage: str, prompt: int, completion: int, **extra
) -> None:
    """One request of a pipeline's stage ("" for a direct request) in each hour, in eu-west-1."""
    UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=uuid.uuid4().hex,
            tenant=tenant,
            model_name=deployment.name,
            region="eu-west-1",
            deployment=deployment,
            version="tiny-llama@1.0.0",
            pipeline=pipeline,
            stage=stage,
            status=200,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=10,
            started_at=START + timedelta(hours=n, minutes=30),
            hour=START + timedelta(hours=n),
            **extra,
        )
        for n in range(HOURS)
    )


@pytest.fixture
def fleet(world: World, make_region, tiny_model_dir, settings) -> Fleet:  # type: ignore[no-untyped-def]
    """Ten hours of one 2.50 GPU on each deployment; weighted tokens (a prompt token 0.25) per hour:
    chat: acme's rewrite 100, acme direct 50 (dedicated: acme pays all 2.50, two thirds and one third);
    assistant (1000 an hour at most): acme's answer 300, globex's classify 150, globex direct 100, so 55 %
    used: acme 0.75, globex 0.625 of which the half cent goes to idle by name, idle 1.125."""
    settings.BILLING_TOKENS_PER_GPU_HOUR = {"default": 1000}
    settings.BILLING_PROMPT_TOKEN_WEIGHT = 0.25
    region = make_region("eu-west-1", "EU")
    operator = principal(world.operator)
    v1 = tiny_version(operator, tiny_model_dir)
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
        held(deployment, v1, START, hours=HOURS)
    acme, globex = world.tenant_a, world.tenant_b
    usage(acme, chat, RAG, "rewrite", prompt=200, completion=50)
    usage(acme, chat, "", "", prompt=100, completion=25)
    usage(acme, assistant, RAG, "answer", prompt=400, completion=200)
    usage(acme, assistant, RAG, "answer", prompt=400, completion=200, track="cache")  # no GPU ran
    usage(globex, assistant, TRIAGE, "classify", prompt=200, completion=100)
    usage(globex, assistant, "", "", prompt=0, completion=100)
    return Fleet(chat, assistant)


def month() -> reports.Report:
    start, end = reports.month_bounds("2025-06")
    return reports.build(start, end, now=NOW)


def totals(rows: list[dict[str, Any]], dimensions: list[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """The rows summed up to ``dimensions``: what the stages add up to."""
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[d] for d in dimensions)
        summed = found.setdefault(key, dict.fromkeys(MEASURES, 0))
        for measure in MEASURES:
            summed[measure] += row[measure]
    return found


def test_each_stage_gets_its_usage_share_of_the_tenants_cost(world, fleet):
    rows = reports.summarize(month(), BY_STAGE, None)
    cost = {(r["tenant"], r["deployment"], r["pipeline"], r["stage"]): r["cost"] for r in rows}
    assert cost == {
        # 2.50 an hour by 100 : 50 is 1.6667 and 0.8333; the hour's spare cent to the larger remainder.
        ("acme", "acme/chat", RAG, "rewrite"): Decimal("16.70"),
        ("acme", "acme/chat", "(direct)", "(direct)"): Decimal("8.30"),
        ("acme", "acme/assistant", RAG, "answer"): Decimal("7.50"),
        # globex's 0.62 an hour by 150 : 100 is 0.372 and 0.248: the spare cent to direct.
        ("globex", "acme/assistant", TRIAGE, "classify"): Decimal("3.70"),
        ("globex", "acme/assistant", "(direct)", "(direct)"): Decimal("2.50"),
        ("(idle)", "acme/assistant", "(idle)", "(idle)"): Decimal("11.30"),
    }
    answer = next(r for r in rows if r["stage"] == "answer")
    assert (answer["requests"], answer["cached_requests"], answer["prompt_tokens"]) == (20, 10, 8000)
    rewrite = next(r for r in rows if r["stage"] == "rewrite")
    assert rewrite["gpu_hours"] == Decimal("6.667")  # two thirds of the ten GPU-hours acme paid for


def test_stages_add_up_to_the_tenant_region_and_deployment_totals(world, fleet):
    report = month()
    for dimensions in (["tenant"], ["tenant", "region", "deployment"], ["deployment"], ["region"]):
        whole = {tuple(r[d] for d in dimensions): r for r in reports.summarize(report, dimensions, None)}
        summed = totals(reports.summarize(report, BY_STAGE, None), dimensions)
        assert set(summed) == set(whole), dimensions
        for key, parts in summed.items():
            assert parts == {m: whole[key][m] for m in MEASURES}, (dimensions, key)
    # The split moves no cent between tenants: the budgets' figures are the ones before stages existed.
    assert reports.spent_by_tenant(report) == {
        "acme": Decimal("25.00") + Decimal("7.50"),
        "globex": Decimal("6.20"),
        "": Decimal("11.30"),
    }


def test_group_by_pipeline_sums_each_pipeline_over_its_stages_and_deployments(world, fleet):
    rows = reports.summarize(month(), ["pipeline"], None)
    found = {r["pipeline"]: (r["cost"], r["requests"]) for r in rows}
    assert found == {
        RAG: (Decimal("24.20"), 30),  # rewrite on chat, answer on assistant (cached answers included)
        TRIAGE: (Decimal("3.70"), 10),
        "(direct)": (Decimal("10.80"), 20),
        "(idle)": (Decimal("11.30"), 0),  # idle capacity is nobody's direct request
    }
    assert sum((cost for cost, _ in found.values()), Decimal(0)) == Decimal("50.00")  # 20 GPU-hours × 2.50


def test_an_owners_hour_without_requests_is_outside_pipelines(world, fleet):
    UsageRecord.objects.filter(deployment=fleet.chat, hour=START).delete()
    rows = reports.summarize(month(), BY_STAGE, {"acme"})
    chat = {(r["pipeline"], r["stage"]): r["cost"] for r in rows if r["deployment"] == "acme/chat"}
    # The owner still pays that hour (dedicated), but no stage used it.
    assert chat == {(RAG, "rewrite"): Decimal("15.03"), ("(direct)", "(direct)"): Decimal("9.97")}
    assert sum(chat.values()) == Decimal("25.00")


def test_mirrored_copies_of_a_stage_are_the_platforms_not_the_pipelines(world, fleet):
    usage(world.tenant_a, fleet.assistant, RAG, "answer", prompt=300, completion=200, track="mirror")
    report = month()
    acme = reports.summarize(report, ["pipeline", "stage"], {"acme"})
    assert next(r for r in acme if r["stage"] == "answer")["requests"] == 20  # as before the copies
    operator = reports.summarize(report, ["tenant", "pipeline"], None)
    evaluation = next(r for r in operator if r["tenant"] == "(evaluation)")
    assert (evaluation["pipeline"], evaluation["requests"], evaluation["cost"]) == ("(evaluation)", 10, 0)


def test_the_api_groups_by_pipeline_and_stage_within_the_callers_tenants(world, fleet, api):
    url = "/api/v1/costs/?month=2025-06&group_by=tenant,pipeline,stage"
    with time_machine.travel(NOW, tick=False):  # the API reads the clock at its edge
        mine, theirs = api(world.alice).get(url).json(), api(world.bob).get(url).json()
        operator = api(world.operator).get(url).json()
        exported = api(world.bob).get(url + "&export=csv").content.decode()
    assert [(r["tenant"], r["pipeline"], r["stage"], r["cost"]) for r in mine["rows"]] == [
        ("acme", "(direct)", "(direct)", "8.30"),
        ("acme", RAG, "answer", "7.50"),
        ("acme", RAG, "rewrite", "16.70"),
    ]
    assert mine["total"] == "32.50" and TRIAGE not in str(mine)  # not even globex's pipeline's name
    assert [(r["tenant"], r["pipeline"], r["stage"], r["cost"]) for r in theirs["rows"]] == [
        ("globex", "(direct)", "(direct)", "2.50"),
        ("globex", TRIAGE, "classify", "3.70"),
    ]
    assert RAG not in str(theirs) and "(idle)" not in str(theirs)
    assert operator["total"] == "50.00" and {r["tenant"] for r in operator["rows"]} == {
        "acme",
        "globex",
        "(idle)",
    }
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert list(rows[0])[:4] == ["tenant", "pipeline", "stage", "cost"]
    assert {(r["pipeline"], r["stage"]) for r in rows} == {("(direct)", "(direct)"), (TRIAGE, "classify")}


def test_an_unknown_group_by_is_still_refused_with_the_error_envelope(world, fleet, api):
    for group_by in ("pipeline,planet", "stages", ""):
        reply = api(world.alice).get(f"/api/v1/costs/?month=2025-06&group_by={group_by},")
        assert reply.status_code == 400, group_by
        error = reply.json()["error"]
        assert error["code"] == "invalid" and "pipeline, stage" in error["message"]
