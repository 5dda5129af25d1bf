"""Every caller of the residency rule agrees with it (issue 11 §4), over random tenants (residencies),
versions (a tenant's private one or a platform catalog one, any allowed jurisdictions) and regions.

Each example builds a world in the database and drives the real code: admission's region choices, the
copy itself (with bytes in per-region stores), copy-ahead when staged, the route table (a private
deployment for its owner; a shared one for every tenant) and usage ingestion's check; then compares what
each did with ``residency_refusal``. The rule's own truth table is spelled out in the first test.
"""

import hashlib
import itertools
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifacts.drivers.stores import LocalStore, blob_key, store_from_config
from artifacts.models import ArtifactReplica
from artifacts.services.garbage import collect_garbage
from artifacts.services.replication import replica_for, replicate
from artifacts.services.scheduling import replicate_ahead_when_staged
from artifacts.tasks import resume_replication
from billing.services import usage_ingest
from core.models import AuditEvent, Tenant
from core.principal import Principal
from core.residency import Residency, Weights, residency_of, residency_refusal, weights_of
from regions.choices import TargetStatus
from regions.models import Deployment, DeploymentTarget, GpuPool, Region
from regions.services.placement import region_choices
from registry.models import ModelVersion
from registry.services.models import model_register
from routing.routes import route_table
from routing.selectors import placements, policies
from tests.support.factories import TenantFactory
from tests.support.registry import register

JURISDICTIONS = ["EU", "US", "CH", "UK"]
DATA = b"weights of the property test"
SHA = hashlib.sha256(DATA).hexdigest()
counter = itertools.count()

residencies = st.sets(st.sampled_from(JURISDICTIONS), min_size=1).map(sorted)


def test_the_rule_itself():
    acme = Residency("acme", frozenset({"EU"}))
    globex = Residency("globex", frozenset({"US", "EU"}))
    private = Weights("acme/m@1", frozenset({"EU", "US"}), acme)
    catalog = Weights("platform/m@1", frozenset({"EU", "US"}), None)
    assert residency_refusal(private, "EU") is None
    assert "belongs to acme" in (residency_refusal(private, "US") or "")  # the bug of issue 11 §4
    assert residency_refusal(catalog, "US") is None  # shared weights: the version's list governs
    assert "outside acme's residency" in (residency_refusal(catalog, "US", serving=acme) or "")
    assert residency_refusal(catalog, "US", serving=globex) is None
    assert "may not be stored in CH" in (residency_refusal(catalog, "CH") or "")
    assert "may not be served in CH" in (
        residency_refusal(catalog, "CH", serving=Residency("c", frozenset({"CH"}))) or ""
    )


@pytest.fixture
def home(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.ARTIFACT_HOME_STORE = {"kind": "local", "root": str(tmp_path / "home")}
    settings.ARTIFACT_COPY_TUNING = {"part_size": 5 * 1024 * 1024, "concurrency": 1}
    settings.ARTIFACT_REPLICATE_ON_STAGED = True
    store = LocalStore(tmp_path / "home")
    upload = store.begin(blob_key(SHA))
    store.complete(blob_key(SHA), upload, {1: store.put_part(blob_key(SHA), upload, 1, DATA)}, SHA)
    return store


@pytest.fixture
def enqueued(monkeypatch):  # type: ignore[no-untyped-def]
    """Copies enqueued (by copy-ahead), recorded instead of sent to a worker."""
    from artifacts import tasks

    sent: list[int] = []
    monkeypatch.setattr(tasks.replicate_artifact, "delay", sent.append)
    return sent


def make_regions(jurisdictions: list[str], root: Path) -> list[Region]:
    regions = []
    for n, jurisdiction in enumerate(jurisdictions):
        code = f"r{n}-{jurisdiction.lower()}-{next(counter)}"
        region = Region.objects.create(
            code=code,
            name=code,
            provider="local",
            jurisdiction=jurisdiction,
            driver="process",
            driver_config={"state_dir": str(root / code)},
            object_store={"kind": "local", "root": str(root / "stores" / code)},  # fresh bytes every example
        )
        GpuPool.objects.create(region=region, gpu_type="L4", memory_gib=24, gpu_count=4)
        regions.append(region)
    return regions


def make_version(world, owner: Tenant | None, allowed: list[str]):  # type: ignore[no-untyped-def]
    actor = Principal.system("test")
    model = model_register(
        actor=actor, owner=owner, name=f"m{next(counter)}", visibility="private" if owner else "catalog"
    )
    return register(
        model,
        actor,
        "1.0.0",
        sha=SHA,
        artifact_size_bytes=len(DATA),
        artifact_manifest=[],
        allowed_jurisdictions=allowed,
    )


def deploy_everywhere(owner: Tenant, version, regions: list[Region], shared: bool) -> Deployment:  # type: ignore[no-untyped-def]
    """A deployment ready in every region, made as if admitted when the policies were wider."""
    deployment = Deployment.objects.create(
        owner=owner,
        name="chat",
        model=version.model,
        version=version,
        gpu_type="L4",
        gpu_count=1,
        shared=shared,
        created_by_name="test",
    )
    for region in regions:
        DeploymentTarget.objects.create(
            deployment=deployment,
            region=region,
            status=TargetStatus.READY,
            ready_replicas=1,
            endpoints=[f"http://{region.code}.invalid:8000"],
        )
    return deployment


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    owner_residency=residencies,
    caller_residency=residencies,
    catalog=st.booleans(),
    allowed=st.sets(st.sampled_from(JURISDICTIONS)).map(sorted),
    jurisdictions=st.lists(st.sampled_from(JURISDICTIONS), min_size=1, max_size=5),
    changed_residency=st.none() | residencies,
    changed_allowed=st.sets(st.sampled_from(JURISDICTIONS)).map(sorted),
)
def test_placement_replication_copy_ahead_routing_and_usage_agree_with_the_rule(
    world,
    home,
    enqueued,
    tmp_path,
    owner_residency,
    caller_residency,
    catalog,
    allowed,
    jurisdictions,
    changed_residency,
    changed_allowed,
):
    with transaction.atomic():
        owner = TenantFactory(slug=f"owner-{next(counter)}", residency=owner_residency)
        caller = TenantFactory(slug=f"caller-{next(counter)}", residency=caller_residency)
        regions = make_regions(jurisdictions, tmp_path / uuid.uuid4().hex)
        version = make_version(world, None if catalog else owner, allowed)
        weights = weights_of(version)
        may_store = {r.code: residency_refusal(weights, r.jurisdiction) for r in regions}
        # The tenants that would call it: the owner for a private version, everyone for a catalog one.
        callers = list(Tenant.objects.all()) if catalog else [owner]
        may_serve = {
            (t.slug, r.code): residency_refusal(weights, r.jurisdiction, serving=residency_of(t))
            for t in callers
            for r in regions
        }

        # Placement: admission for each calling tenant.
        for tenant in callers if catalog else [owner]:
            choices = region_choices(tenant=tenant, version=version, gpu_type="L4", gpu_count=1, replicas=1)
            for choice in choices:
                if choice.region in regions:
                    refusal = may_serve[(tenant.slug, choice.region.code)]
                    assert choice.eligible == (refusal is None), (choice.region, choice.reasons)
                    assert refusal is None or refusal in choice.reasons

        # Copy-ahead: staged → a copy enqueued exactly where the weights may be stored.
        enqueued.clear()
        replicate_ahead_when_staged(version, "staged")
        ahead = {replica_pk_region(pk) for pk in enqueued}
        assert ahead == {code for code, refusal in may_store.items() if refusal is None}

        # Replication: the copy itself, bytes included.
        for region in regions:
            replica = replicate(replica_for(version, region).pk)
            held = store_from_config(region.object_store).size_of(blob_key(SHA)) is not None
            if may_store[region.code] is None:
                assert replica.state == "ready" and held, replica.last_error
            else:
                assert replica.state == "forbidden" and not held
                assert replica.last_error == may_store[region.code]

        # Routing: a deployment ready in every region (private: its owner's; catalog: shared by all).
        deploy_everywhere(caller if catalog else owner, version, regions, shared=catalog)
        table = route_table(policies(), placements())
        for tenant in callers:
            routed = {e["region"] for e in table[tenant.slug]["models"]["chat"]["endpoints"]}  # type: ignore[index]
            expected = {r.code for r in regions if may_serve[(tenant.slug, r.code)] is None}
            assert routed == expected, (tenant.slug, routed, expected)

        # Usage: a record served from every region for every caller; the check flags exactly the refused.
        deployment = Deployment.objects.get(version=version)
        records = [
            {
                "request_id": uuid.uuid4().hex,
                "tenant": t.slug,
                "region": r.code,
                "deployment": deployment.pk,
                "started_at": "2026-11-29T10:00:00+00:00",
            }
            for t in callers
            for r in regions
        ]
        before = set(AuditEvent.objects.filter(action="usage.outside_residency").values_list("pk", flat=True))
        usage_ingest(actor=Principal.system("gateway"), records=records)
        flagged = AuditEvent.objects.filter(action="usage.outside_residency").exclude(pk__in=before)
        counts = {event.tenant.slug: int(event.message.split(" ")[0]) for event in flagged}
        for tenant in callers:
            refused = sum(1 for r in regions if may_serve[(tenant.slug, r.code)] is not None)
            assert counts.get(tenant.slug, 0) == refused, (tenant.slug, counts)

        # The policies change after the fact: the periodic pass and garbage collection follow the rule.
        if changed_residency is not None:
            owner.residency = changed_residency
            owner.save()
        version.allowed_jurisdictions = changed_allowed
        version.save()
        resume_replication()
        collect_garbage(timedelta(days=7))
        weights = weights_of(ModelVersion.objects.select_related("model__owner").get(pk=version.pk))
        for region in regions:
            replica = ArtifactReplica.objects.get(version=version, region=region)
            held = store_from_config(region.object_store).size_of(blob_key(SHA)) is not None
            now_refused = residency_refusal(weights, region.jurisdiction)
            if now_refused is not None:
                assert replica.state == "forbidden" and not held and replica.last_error == now_refused
            elif may_store[region.code] is None:
                assert replica.state == "ready" and held
            else:
                assert replica.state == "pending"  # reopened: the copy starts again
        callers = list(Tenant.objects.all()) if catalog else [Tenant.objects.get(pk=owner.pk)]
        table = route_table(policies(), placements())
        for tenant in callers:
            routed = {e["region"] for e in table[tenant.slug]["models"]["chat"]["endpoints"]}  # type: ignore[index]
            expected = {
                r.code
                for r in regions
                if residency_refusal(weights, r.jurisdiction, serving=residency_of(tenant)) is None
                and may_store[r.code] is None  # a verified copy exists there
            }
            assert routed == expected, (tenant.slug, routed, expected)
        transaction.set_rollback(True)


def replica_pk_region(pk: int) -> str:
    return ArtifactReplica.objects.select_related("region").get(pk=pk).region.code
