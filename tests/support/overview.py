"""The fleet the Overview shows, at a fixed moment ``NOW``: two regions, a ready and a failed deployment,
traffic, spend, failovers and a budget alert. ``fleet`` is a fixture (tests/controlplane and tests/browser
take it in their conftest.py)."""

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.models import BudgetAlert, CapacitySegment, GpuPrice, UsageRecord
from controlplane import overview
from regions.choices import TargetStatus
from regions.models import Deployment, Region
from regions.services.deployments import deployment_create
from routing.choices import RoutingEventKind
from routing.models import EndpointHealth, RoutingEvent
from tests.support.principals import World, principal
from tests.support.regions import tiny_version

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


@dataclass
class Fleet:
    eu: Region
    us: Region
    chat: Deployment  # tenant A's, ready in eu-west-1
    bot: Deployment  # tenant B's, failed in us-east-1


def _usage(
    deployment: Deployment, region: str, count: int, prompt: int, completion: int, at: datetime
) -> None:
    UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=uuid.uuid4().hex,
            tenant=deployment.owner,
            model_name=deployment.name,
            region=region,
            deployment=deployment,
            version="tiny-llama@1.0.0",
            status=200,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=10,
            started_at=at,
            hour=at.replace(minute=0, second=0, microsecond=0),
        )
        for _ in range(count)
    )


def _capacity(deployment: Deployment, region: Region, since: datetime, price: str) -> None:
    CapacitySegment.objects.create(
        deployment=deployment,
        version=deployment.version,
        region=region,
        gpu_type="L4",
        gpus=1,
        started_at=since,
    )
    GpuPrice.objects.create(
        region=region, gpu_type="L4", hourly_price=Decimal(price), effective_from=since - timedelta(days=30)
    )


@pytest.fixture
def fleet(world: World, make_region, tiny_model_dir, monkeypatch) -> Fleet:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(overview, "clock", lambda: NOW)
    eu, us = make_region("eu-west-1", "EU"), make_region("us-east-1", "US")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    chat = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    bot = deployment_create(
        actor=principal(world.bob),
        owner=world.tenant_b,
        name="globex-bot",
        model=version.model,
        version="1.0.0",
    )
    chat.targets.update(status=TargetStatus.READY, ready_replicas=1, endpoints=["http://127.0.0.1:1/a"])
    bot.targets.update(status=TargetStatus.FAILED, last_error="engine exited with 137 (out of memory)")
    EndpointHealth.objects.create(url="http://127.0.0.1:1/a", region=eu)
    EndpointHealth.objects.create(url="http://127.0.0.1:1/b", region=us, state="unhealthy")
    # Month to date: A's GPU for 24 h at 2.00 (12 h of it today), B's for 6 h at 3.00, all today.
    _capacity(chat, eu, NOW - timedelta(hours=24), "2.00")
    _capacity(bot, us, NOW - timedelta(hours=6), "3.00")
    # Last 5 minutes: A 30 requests of 150 tokens, B 60 of 300; and older traffic that does not count.
    _usage(chat, "eu-west-1", 30, 100, 50, NOW - timedelta(minutes=2))
    _usage(bot, "us-east-1", 60, 200, 100, NOW - timedelta(minutes=3))
    _usage(chat, "eu-west-1", 500, 100, 50, NOW - timedelta(minutes=20))
    RoutingEvent.objects.create(
        kind=RoutingEventKind.FAILOVER,
        tenant=world.tenant_a,
        message="acme/chat failed over to eu-central-1",
        at=NOW - timedelta(minutes=30),
    )
    RoutingEvent.objects.create(
        kind=RoutingEventKind.UNAVAILABLE,
        tenant=world.tenant_b,
        message="globex/globex-bot has no region",
        at=NOW - timedelta(minutes=10),
    )
    BudgetAlert.objects.create(
        tenant=world.tenant_b, period="2026-06", threshold=80, spent=Decimal("32000"), budget=Decimal("40000")
    )
    return Fleet(eu, us, chat, bot)
