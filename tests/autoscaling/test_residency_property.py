"""Never outside residency: over random fleets (regions of random jurisdictions, statuses, pool sizes and
prices), tenant residencies and quotas, version jurisdictions, policies and loads, no pass of the
autoscaler ever places a deployment's replica in a region ``core.residency`` refuses, over-commits a GPU
pool or exceeds the tenant's quota."""

import itertools
import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import F, Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaling import evaluator
from autoscaling.services.policies import policy_set
from billing.models import GpuPrice
from core.models import Tenant
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from regions.models import Deployment, DeploymentTarget, GpuPool, Region
from registry.models import ModelVersion, RegisteredModel
from routing.models import EndpointHealth
from tests.support.autoscaling import NOW, request

pytestmark = pytest.mark.django_db
JURISDICTIONS = ["EU", "CH", "US", "UK", "JP"]
SYSTEM = Principal.system("property")
counter = itertools.count()

region_specs = st.lists(
    st.tuples(
        st.sampled_from(JURISDICTIONS),
        st.integers(min_value=0, max_value=4),  # GPUs in the pool: small, so that growth spills
        st.none() | st.integers(min_value=1, max_value=9),  # hourly price (None: not in the catalog)
        st.sampled_from(["active", "active", "active", "draining"]),
    ),
    min_size=1,
    max_size=6,
)
jurisdiction_sets = st.sets(st.sampled_from(JURISDICTIONS), min_size=1).map(sorted)


def make_fleet(specs: list[tuple[str, int, int | None, str]], folder: str) -> list[Region]:
    regions = []
    for index, (jurisdiction, gpus, hourly, status) in enumerate(specs):
        region = Region.objects.create(
            code=f"r{index}-{jurisdiction.lower()}",
            name=f"R{index}",
            provider="local",
            jurisdiction=jurisdiction,
            status=status,
            driver="process",
            driver_config={"state_dir": f"{folder}/r{index}", "engine": "simulator"},
        )
        GpuPool.objects.create(region=region, gpu_type="L4", memory_gib=24, gpu_count=gpus)
        if hourly is not None:
            GpuPrice.objects.create(
                region=region,
                gpu_type="L4",
                hourly_price=Decimal(hourly),
                effective_from=NOW - timedelta(days=1),
            )
        regions.append(region)
    return regions


def make_version(tenant: Tenant, allowed: list[str]) -> ModelVersion:
    model = RegisteredModel.objects.create(owner=tenant, name="chat-model")
    return ModelVersion.objects.create(
        model=model,
        version="1.0.0",
        status="production",
        artifact_uri="s3://models/chat/",
        artifact_sha256="a" * 64,
        artifact_size_bytes=1024,
        artifact_format="safetensors",
        served_model_name="chat",
        runtime_version="0.33.0",
        runtime_image="vllm/vllm-openai:v0.33.0",
        max_context_length=512,
        parameter_count=3_000_000,
        dtype="float32",
        allowed_jurisdictions=allowed,
        created_by_name="property",
    )


def admit(tenant: Tenant, version: ModelVersion, home: Region, name: str) -> Deployment:
    """A one-replica deployment in ``home`` (compliant, with a GPU free), as admission would have made it."""
    deployment = Deployment.objects.create(
        owner=tenant, name=name, model=version.model, version=version, gpu_type="L4", created_by_name="p"
    )
    DeploymentTarget.objects.create(deployment=deployment, region=home, desired_replicas=1)
    return deployment


def show_load(deployment: Deployment, rng: random.Random, at) -> None:  # type: ignore[no-untyped-def]
    """Every live region of the deployment ready at its replicas, each endpoint with a random load, and
    most of the time a request just metered there (an idle one may go to zero)."""
    for live in deployment.targets.exclude(status="deleted").select_related("region"):
        if rng.random() < 0.7:
            request(deployment, live.region.code, at - timedelta(seconds=1))
        urls = [f"http://10.{live.pk % 250}.{live.pk // 250}.{i}:8000" for i in range(live.desired_replicas)]
        DeploymentTarget.objects.filter(pk=live.pk).update(
            status="ready" if urls else "paused",
            endpoints=urls,
            ready_replicas=len(urls),
            last_transition_at=NOW - timedelta(days=1),
        )
        for url in urls:
            EndpointHealth.objects.update_or_create(
                url=url,
                defaults={
                    "region": live.region,
                    "checked_at": at,
                    "running": rng.choice([0.0, 1.0, 4.0, 12.0, 40.0, 40.0]),
                    "waiting": rng.choice([0.0, 0.0, 3.0, 20.0]),
                    "kv_cache": rng.random(),
                },
            )


def replicas_now(tenant: Tenant) -> dict[int, int]:
    live = DeploymentTarget.objects.filter(deployment__owner=tenant).exclude(status="deleted")
    return dict(live.values_list("pk", "desired_replicas"))


def check_invariants(
    tenant: Tenant, version: ModelVersion, regions: list[Region], admitted: int, before: dict[int, int]
) -> None:
    """After a pass: no region residency refuses has a target it did not have, or more replicas than it
    had; no pool is over-committed; the tenant's quota holds."""
    weights, serving = weights_of(version), residency_of(tenant)
    live = DeploymentTarget.objects.filter(deployment__owner=tenant).exclude(status="deleted")
    for found in live.select_related("region"):
        refusal = residency_refusal(weights, found.region.jurisdiction, serving=serving)
        if refusal is not None:
            assert found.pk in before, f"{found} placed in {found.region.jurisdiction}: {refusal}"
            assert found.desired_replicas <= before[found.pk], f"{found} grew: {refusal}"
    for region in regions:
        used = live.filter(region=region, desired_replicas__gt=0).aggregate(
            gpus=Sum(F("desired_replicas") * F("deployment__gpu_count"))
        )["gpus"]
        pool = region.gpu_pools.get()
        assert (used or 0) <= pool.gpu_count, f"{region.code}: {used} of {pool.gpu_count} GPUs"
    if tenant.max_gpus is not None:  # the deployments admitted by hand may start above it: never more
        total = live.aggregate(gpus=Sum(F("desired_replicas") * F("deployment__gpu_count")))["gpus"]
        assert (total or 0) <= max(tenant.max_gpus, admitted), (total, tenant.max_gpus)


@pytest.mark.heavy  # a property search: 30 random fleets, each through several passes
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=region_specs,
    residency=jurisdiction_sets,
    allowed=jurisdiction_sets,
    quota=st.none() | st.integers(min_value=2, max_value=12),
    deployments=st.integers(min_value=1, max_value=3),
    max_replicas=st.integers(min_value=1, max_value=6),
    min_zero=st.booleans(),
    steps=st.lists(st.sampled_from([15, 15, 61, 301, 901]), min_size=2, max_size=6),
    seed=st.integers(min_value=0, max_value=2**32),
    narrowed=st.none() | jurisdiction_sets,  # the tenant's residency changed midway (narrowed, or not)
)
def test_no_pass_ever_places_a_replica_outside_residency(
    db, tmp_path, specs, residency, allowed, quota, deployments, max_replicas, min_zero, steps, seed, narrowed
):
    # Some region must be able to take the deployments first: the first one is inside both policies.
    allowed = sorted({*allowed, residency[0]})
    specs = [(residency[0], max(specs[0][1], deployments), specs[0][2], "active"), *specs[1:]]
    with transaction.atomic():  # each example in its own savepoint, rolled back at its end
        tenant = Tenant.objects.create(
            slug=f"t{next(counter)}", name="T", residency=residency, max_gpus=quota
        )
        regions = make_fleet(specs, str(tmp_path))
        version = make_version(tenant, allowed)
        weights, serving = weights_of(version), residency_of(tenant)
        homes = [
            r
            for r in regions
            if r.status == "active"
            and r.gpu_pools.get().gpu_count >= deployments
            and residency_refusal(weights, r.jurisdiction, serving=serving) is None
        ]
        rng = random.Random(seed)
        fleet = [admit(tenant, version, rng.choice(homes), f"d{n}") for n in range(deployments)]
        cap = max_replicas if quota is None else max(1, min(max_replicas, quota))
        for deployment in fleet:
            policy_set(
                actor=SYSTEM,
                deployment=deployment,
                body={"running": 4, "waiting": 2, "max_replicas": cap, "min_replicas": 0 if min_zero else 1},
            )
        now = NOW
        for index, step in enumerate(steps):
            if narrowed is not None and index == len(steps) // 2:
                Tenant.objects.filter(pk=tenant.pk).update(residency=narrowed)
                tenant.refresh_from_db()
                version = ModelVersion.objects.select_related("model__owner").get(pk=version.pk)
            now += timedelta(seconds=step)
            for deployment in fleet:
                show_load(deployment, rng, now)
            before = replicas_now(tenant)
            evaluator.evaluate_all(now=now)
            check_invariants(tenant, version, regions, len(fleet), before)
        transaction.set_rollback(True)
