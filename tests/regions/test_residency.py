"""Data residency (issue 11 §4): a tenant's private weights never leave the tenant's residency, whatever
the version's own allowed jurisdictions say; on request, when staged, and after the tenant narrows it."""

import hashlib

import pytest

from artifacts.drivers.stores import LocalStore, blob_key, store_from_config
from artifacts.models import ArtifactReplica
from artifacts.services.garbage import collect_garbage
from artifacts.services.replication import replica_for, replicate
from artifacts.services.scheduling import replica_request
from artifacts.tasks import resume_replication
from core.models import AuditEvent
from regions.models import Region
from registry.services.lifecycle import version_transition
from registry.services.reports import report_submit
from tests.support.principals import principal
from tests.support.registry import GOOD_METRICS, register


@pytest.fixture
def home(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.ARTIFACT_HOME_STORE = {"kind": "local", "root": str(tmp_path / "home")}
    settings.ARTIFACT_COPY_TUNING = {"part_size": 5 * 1024 * 1024, "concurrency": 1}
    return LocalStore(tmp_path / "home")


@pytest.fixture
def copies_now(monkeypatch):  # type: ignore[no-untyped-def]
    """Run every enqueued copy at once, in this process: what a worker would do with it."""
    from artifacts import tasks

    monkeypatch.setattr(tasks.replicate_artifact, "delay", lambda pk: replicate(pk))


def put_blob(store: LocalStore, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    upload = store.begin(blob_key(sha))
    store.complete(blob_key(sha), upload, {1: store.put_part(blob_key(sha), upload, 1, data)}, sha)
    return sha


def stored_region(make_region, tmp_path, code: str, jurisdiction: str) -> Region:  # type: ignore[no-untyped-def]
    region = make_region(code, jurisdiction)
    region.object_store = {"kind": "local", "root": str(tmp_path / f"store-{code}")}
    region.save()
    return region


def holds(region: Region, sha: str) -> bool:
    return store_from_config(region.object_store).size_of(blob_key(sha)) is not None


@pytest.fixture
def eu_private(world, chat_model, home):  # type: ignore[no-untyped-def]
    """acme (residency EU, CH) registers a private version whose metadata allows EU and US."""
    data = b"acme's fine-tuned weights"
    return register(
        chat_model,
        principal(world.alice),
        "1.0.0",
        sha=put_blob(home, data),
        artifact_size_bytes=len(data),
        artifact_manifest=[],
        allowed_jurisdictions=["EU", "US"],
    )


def test_a_private_version_is_not_copied_outside_its_owners_residency_on_request(
    world, eu_private, make_region, tmp_path
):
    us = stored_region(make_region, tmp_path, "us-east-1", "US")
    requested = replica_request(actor=principal(world.alice), version=eu_private, region=us)
    replica = replicate(requested.pk)
    assert replica.state == "forbidden", replica.state
    assert "acme" in replica.last_error and "residency" in replica.last_error
    assert not holds(us, eu_private.artifact_sha256)
    assert AuditEvent.objects.filter(action="artifact.replication_forbidden").count() == 1


def test_staging_a_private_version_copies_ahead_only_inside_its_owners_residency(
    world, eu_private, make_region, tmp_path, copies_now, django_capture_on_commit_callbacks
):
    actor = principal(world.alice)
    eu = stored_region(make_region, tmp_path, "eu-west-1", "EU")
    us = stored_region(make_region, tmp_path, "us-east-1", "US")
    report_submit(actor=actor, version=eu_private, **GOOD_METRICS)
    with django_capture_on_commit_callbacks(execute=True):
        for state in ("validating", "validated", "staged"):
            version_transition(actor=actor, version=eu_private, to=state)
    assert holds(eu, eu_private.artifact_sha256)
    assert not holds(us, eu_private.artifact_sha256)
    assert not ArtifactReplica.objects.filter(region=us, state="ready").exists()


def test_narrowing_residency_forbids_existing_copies_and_collects_them(
    world, eu_private, make_region, tmp_path
):
    world.tenant_a.residency = ["EU", "CH", "US"]
    world.tenant_a.save()
    eu = stored_region(make_region, tmp_path, "eu-west-1", "EU")
    us = stored_region(make_region, tmp_path, "us-east-1", "US")
    assert replicate(replica_for(eu_private, eu).pk).state == "ready"
    assert replicate(replica_for(eu_private, us).pk).state == "ready"

    world.tenant_a.residency = ["EU", "CH"]  # narrowed after the fact
    world.tenant_a.save()
    resume_replication()  # the periodic pass re-checks every replica, ready ones included
    states = dict(ArtifactReplica.objects.values_list("region__code", "state"))
    assert states == {"eu-west-1": "ready", "us-east-1": "forbidden"}

    from datetime import timedelta

    collect_garbage(timedelta(days=7))  # the out-of-border copy is deleted; the allowed one stays
    assert not holds(us, eu_private.artifact_sha256) and holds(eu, eu_private.artifact_sha256)
    assert ArtifactReplica.objects.get(region=us).state == "forbidden"
    assert AuditEvent.objects.filter(action="artifact.replica_deleted").count() == 1


def test_a_copy_requested_through_the_api_is_forbidden_in_the_answer(
    world, eu_private, make_region, tmp_path, api, enqueued_nothing
):
    us = stored_region(make_region, tmp_path, "us-east-1", "US")
    body = {"model": "acme/llama-3-8b", "version": "1.0.0", "region": us.code}
    answer = api(world.alice).post("/api/v1/artifacts/replicas/", body, format="json")
    assert answer.status_code == 202 and answer.json()["state"] == "forbidden", answer.json()
    assert "acme" in answer.json()["last_error"] and not enqueued_nothing
    outsider = api(world.bob).post("/api/v1/artifacts/replicas/", body, format="json")
    assert outsider.status_code == 404  # another tenant's model is not there for globex


@pytest.fixture
def enqueued_nothing(monkeypatch):  # type: ignore[no-untyped-def]
    from artifacts import tasks

    sent: list[int] = []
    monkeypatch.setattr(tasks.replicate_artifact, "delay", sent.append)
    return sent


def test_a_copy_cannot_start_while_garbage_collection_deletes_a_forbidden_replicas_bytes(
    world, eu_private, make_region, tmp_path, monkeypatch
):
    """GC claims the forbidden replica before deleting its bytes: a residency widened meanwhile reopens it,
    but no copy may start (and find the half-deleted blobs "already there") until the deletion is done."""
    from datetime import timedelta

    from artifacts.services import garbage, replication

    world.tenant_a.residency = ["EU", "CH", "US"]
    world.tenant_a.save()
    us = stored_region(make_region, tmp_path, "us-east-1", "US")
    assert replicate(replica_for(eu_private, us).pk).state == "ready"
    world.tenant_a.residency = ["EU", "CH"]
    world.tenant_a.save()
    resume_replication()
    replica = ArtifactReplica.objects.get(region=us)
    assert replica.state == "forbidden"

    seen: list[bool] = []
    delete = garbage._delete_blobs

    def widened_while_deleting(target: ArtifactReplica) -> None:
        world.tenant_a.residency = ["EU", "CH", "US"]
        world.tenant_a.save()
        replication._reopen(target)  # what the periodic pass does on a widened policy
        seen.append(replication._claim(ArtifactReplica.objects.get(pk=target.pk)))
        delete(target)

    monkeypatch.setattr(garbage, "_delete_blobs", widened_while_deleting)
    collect_garbage(timedelta(days=7))
    assert seen == [False]  # no copy claimed the replica while its bytes were being deleted
    after = ArtifactReplica.objects.get(pk=replica.pk)
    assert after.state == "pending" and after.lease_until is None and after.bytes_copied == 0
    assert replicate(after.pk).state == "ready" and holds(us, eu_private.artifact_sha256)
