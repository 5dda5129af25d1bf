"""Artifact replication against real S3 HTTP endpoints (moto standalone servers) and the real boto3 client."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from moto.server import ThreadedMotoServer

from artifacts.drivers.copier import CopyTuning, copy_blob
from artifacts.drivers.stores import LocalStore, S3Store, blob_key, s3_client, store_from_config
from artifacts.models import ArtifactReplica
from artifacts.services.replication import replica_for, replicate
from artifacts.tasks import resume_replication
from core.models import AuditEvent
from regions.drivers.base import DriverError
from tests.support.artifacts import put_blob, region_with_store
from tests.support.principals import principal
from tests.support.processes import child_env, wait_for
from tests.support.registry import register

MiB = 1024 * 1024
SMALL = CopyTuning(part_size=5 * MiB, concurrency=4)


@pytest.fixture(scope="session")
def s3_endpoints():
    """Two S3 endpoints standing in for two providers' regions."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False) for _ in range(2)]
    for server in servers:
        server.start()
    yield ["http://{}:{}".format(*server.get_host_and_port()) for server in servers]
    for server in servers:
        server.stop()


def bucket(endpoint: str, name: str) -> dict:
    s3_client(endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return {"kind": "s3", "bucket": name, "endpoint_url": endpoint}


def weights_version(world, chat_model, home, data: bytes, **extra):
    sha = put_blob(home, data)
    return register(
        chat_model,
        principal(world.alice),
        "1.0.0",
        sha=sha,
        artifact_size_bytes=len(data),
        artifact_manifest=[],
        **extra,
    )


def test_replicates_verifies_and_is_a_no_op_the_second_time(
    world, chat_model, home, make_region, s3_endpoints
):
    data = os.urandom(12 * MiB + 123)
    version = weights_version(world, chat_model, home, data)
    region = region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-weights"))
    replica = replicate(replica_for(version, region).pk)
    assert replica.state == "ready", replica.last_error
    assert replica.bytes_copied == len(data) and replica.throughput_mbps
    s3 = store_from_config(region.object_store)
    assert b"".join(s3.stream(blob_key(version.artifact_sha256))) == data
    ArtifactReplica.objects.filter(pk=replica.pk).update(state="pending")
    again = replicate(replica.pk)
    assert again.state == "ready" and again.throughput_mbps is None  # nothing moved: content-addressed


def test_residency_fails_closed(world, chat_model, home, make_region, s3_endpoints):
    version = weights_version(world, chat_model, home, b"weights")  # allowed in EU and CH only
    region = region_with_store(make_region, "us-east-1", "US", bucket(s3_endpoints[0], "us-weights"))
    replica = replicate(replica_for(version, region).pk)
    assert replica.state == "forbidden" and "may not be stored in US" in replica.last_error
    assert store_from_config(region.object_store).size_of(blob_key(version.artifact_sha256)) is None
    assert AuditEvent.objects.filter(action="artifact.replication_forbidden").count() == 1


class Crash(Exception):
    pass


class CrashAfter:
    """The real destination store, but the worker 'dies' after a number of parts."""

    def __init__(self, store, parts: int):
        self.store, self.left, self.calls = store, parts, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def put_part(self, *args):
        self.calls += 1
        if self.left == 0:
            raise Crash("worker killed")
        self.left -= 1
        return self.store.put_part(*args)


COPY_IN_A_CHILD = """
import sys
import django
django.setup()
from pathlib import Path
from artifacts.drivers.copier import CopyTuning, copy_blob
from artifacts.drivers.stores import LocalStore, store_from_config
root, endpoint, bucket, sha, size = sys.argv[1:]
copy_blob(
    LocalStore(Path(root)),
    store_from_config({"kind": "s3", "bucket": bucket, "endpoint_url": endpoint}),
    sha,
    int(size),
    tuning=CopyTuning(part_size=5 * 1024 * 1024, concurrency=1),
    upload_id=None,
    remember_upload=lambda u: None,
    progress=lambda n: None,
)
"""


@pytest.mark.subprocess  # a copier to kill
def test_a_killed_copy_resumes_without_recopying_finished_parts(s3_endpoints, tmp_path):
    """SIGKILL a worker mid-copy; the next attempt finds its upload and sends only the missing parts."""
    data = os.urandom(8 * MiB) * 25  # 200 MiB, 40 parts
    source = LocalStore(tmp_path / "src")
    sha = put_blob(source, data)
    destination = store_from_config(bucket(s3_endpoints[1], "resume"))
    key = blob_key(sha)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            COPY_IN_A_CHILD,
            str(source.root),
            s3_endpoints[1],
            "resume",
            sha,
            str(len(data)),
        ],
        env=child_env(),
    )
    try:
        wait_for(lambda: len(_parts_of(destination, key)) >= 3, timeout=60, interval=0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    time.sleep(0.5)  # a part in flight when the worker died may still land
    already = _parts_of(destination, key)
    assert 3 <= len(already) < 40 and destination.size_of(key) is None
    resumed = CrashAfter(destination, 100)
    moved = copy_blob(
        source,
        resumed,
        sha,
        len(data),
        tuning=CopyTuning(part_size=5 * MiB, concurrency=2),
        upload_id=None,  # found by key: the killed worker never got to record it
        remember_upload=lambda u: None,
        progress=lambda n: None,
    )
    assert resumed.calls == 40 - len(already) and moved.moved == len(data) - 5 * MiB * len(already)
    assert moved.verified
    assert b"".join(destination.stream(key)) == data


def _parts_of(store, key: str) -> dict[int, str]:
    upload = store.pending_upload(key)
    return store.parts_done(key, upload) if upload else {}


def test_a_fresh_copy_into_s3_goes_through_the_upload_pipeline_and_checks_the_source(s3_endpoints, tmp_path):
    source = LocalStore(tmp_path / "src")
    data = os.urandom(12 * MiB)
    sha = put_blob(source, data)
    destination = store_from_config(bucket(s3_endpoints[1], "fresh"))
    moved = copy_blob(
        source,
        destination,
        sha,
        len(data),
        tuning=SMALL,
        upload_id=None,
        remember_upload=lambda u: None,
        progress=lambda n: None,
    )
    assert moved.moved == len(data) and moved.verified
    assert b"".join(destination.stream(blob_key(sha))) == data
    (source.root / blob_key(sha)).write_bytes(data[:-1] + b"!")  # same size, one byte of rot
    destination.delete(blob_key(sha))
    with pytest.raises(DriverError, match="checksum mismatch at the source"):
        copy_blob(
            source,
            destination,
            sha,
            len(data),
            tuning=SMALL,
            upload_id=None,
            remember_upload=lambda u: None,
            progress=lambda n: None,
        )
    assert destination.size_of(blob_key(sha)) is None and destination.pending_upload(blob_key(sha)) is None


def test_same_endpoint_copies_server_side(s3_endpoints):
    home_cfg, region_cfg = bucket(s3_endpoints[0], "home-a"), bucket(s3_endpoints[0], "region-a")
    source, destination = store_from_config(home_cfg), store_from_config(region_cfg)
    data = os.urandom(11 * MiB)
    sha = put_blob(source, data)
    counted = CrashAfter(destination, 100)
    copy_blob(
        source,
        counted,
        sha,
        len(data),
        tuning=SMALL,
        upload_id=None,
        remember_upload=lambda u: None,
        progress=lambda n: None,
    )
    assert counted.calls == 0  # no part went through the worker
    assert b"".join(destination.stream(blob_key(sha))) == data


def test_checksum_mismatch_fails_and_leaves_nothing(world, chat_model, home, make_region, s3_endpoints):
    data = os.urandom(MiB)
    version = weights_version(world, chat_model, home, data)
    (home.root / blob_key(version.artifact_sha256)).write_bytes(b"corrupted" + data[9:])  # bit rot at home
    region = region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-mismatch"))
    replica = replicate(replica_for(version, region).pk)
    assert replica.state == "failed" and "checksum mismatch" in replica.last_error and replica.attempts == 1
    assert store_from_config(region.object_store).size_of(blob_key(version.artifact_sha256)) is None


@pytest.mark.slow
def test_a_few_hundred_megabytes_between_two_endpoints(s3_endpoints):
    source = store_from_config(bucket(s3_endpoints[0], "big-src"))
    destination = store_from_config(bucket(s3_endpoints[1], "big-dst"))
    data = os.urandom(64 * MiB) * 4  # 256 MiB
    sha = hashlib.sha256(data).hexdigest()
    upload = source.begin(blob_key(sha))
    parts = {
        n + 1: source.put_part(blob_key(sha), upload, n + 1, data[n * 64 * MiB : (n + 1) * 64 * MiB])
        for n in range(4)
    }
    source.complete(blob_key(sha), upload, parts, sha)
    moved = copy_blob(
        source,
        destination,
        sha,
        len(data),
        tuning=CopyTuning(part_size=32 * MiB, concurrency=8),
        upload_id=None,
        remember_upload=lambda u: None,
        progress=lambda n: None,
    )
    assert moved.moved == len(data) and moved.verified
    assert isinstance(destination, S3Store) and destination.size_of(blob_key(sha)) == len(data)
    from artifacts.drivers.copier import verify_blob

    verify_blob(destination, sha)


@pytest.mark.django_db(transaction=True)
def test_deployment_waits_for_its_regional_copy_then_starts_from_it(
    world, home, make_region, s3_endpoints, tiny_model_dir
):
    from pathlib import Path

    from regions.models import DeploymentTarget
    from regions.reconciler import reconcile_target
    from regions.services.deployments import deployment_create
    from tests.support.regions import tiny_version, until_ready

    files = sorted(p for p in tiny_model_dir.iterdir() if p.is_file())
    manifest = [
        {"path": p.name, "sha256": put_blob(home, p.read_bytes()), "size_bytes": p.stat().st_size}
        for p in files
    ]
    version = tiny_version(principal(world.operator), tiny_model_dir)
    type(version).objects.filter(pk=version.pk).update(
        artifact_uri="s3://home/tiny-llama/", artifact_manifest=manifest
    )
    region = region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-tiny"))
    state_dir = Path(region.driver_config["state_dir"])
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )

    reconcile_target(deployment.targets.get().pk)  # no worker has copied the weights yet: the region waits
    target = DeploymentTarget.objects.get(deployment=deployment)
    assert target.status == "waiting" and "waiting for artifacts" in target.last_error
    assert not list(state_dir.glob("cp-*/replica-*.json"))  # no engine was started

    assert replicate(ArtifactReplica.objects.get(version=version, region=region).pk).state == "ready"
    target = until_ready(deployment)
    cached = {p.name: p.read_bytes() for p in (state_dir / ".models").rglob("*") if p.is_file()}
    assert cached == {p.name: p.read_bytes() for p in files}  # the engine runs from the regional copy
    assert target.endpoints
    (cold_start,) = target.cold_starts  # scheduled → weights cached → engine ready, per replica
    assert (
        cold_start["total_seconds"] >= cold_start["weights_seconds"] >= 0 and cold_start["engine_seconds"] > 0
    )


@pytest.mark.django_db(transaction=True)
def test_replica_api_matrix_retry_and_isolation(
    world, chat_model, home, make_region, s3_endpoints, api, client
):
    data = os.urandom(MiB)
    version = weights_version(world, chat_model, home, data)
    type(version).objects.filter(pk=version.pk).update(status="production")
    region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-api"))
    alice, bob = api(world.alice), api(world.bob)
    body = {"model": "acme/llama-3-8b", "version": "1.0.0", "region": "eu-west-1"}
    assert bob.post("/api/v1/artifacts/replicas/", body, format="json").status_code == 404
    requested = alice.post("/api/v1/artifacts/replicas/", body, format="json")
    assert requested.status_code == 202 and requested.json()["state"] == "pending"
    replica = ArtifactReplica.objects.get()
    ArtifactReplica.objects.filter(pk=replica.pk).update(
        state="failed", last_error="network down", attempts=5
    )
    matrix = alice.get("/api/v1/artifacts/matrix/").json()
    assert matrix["regions"] == ["eu-west-1"]
    assert matrix["rows"][0]["cells"]["eu-west-1"]["last_error"] == "network down"
    assert bob.get("/api/v1/artifacts/matrix/").json() == {"regions": [], "rows": []}
    assert bob.post(f"/api/v1/artifacts/replicas/{replica.pk}/retry/").status_code == 404
    retried = alice.post(f"/api/v1/artifacts/replicas/{replica.pk}/retry/")
    assert (
        retried.status_code == 202
        and retried.json()["state"] == "pending"
        and retried.json()["attempts"] == 0
    )
    assert alice.post(f"/api/v1/artifacts/replicas/{replica.pk}/retry/").status_code == 409  # not failed now
    assert replicate(replica.pk).state == "ready"
    assert api(world.operator).get("/api/v1/artifacts/storage/").json() == {"eu-west-1": len(data)}
    assert alice.get("/api/v1/artifacts/storage/").status_code == 403
    client.force_login(world.bob)
    assert "llama-3-8b" not in client.get("/regions/artifacts/").content.decode()
    assert client.post(f"/regions/artifacts/{replica.pk}/retry/").status_code == 404
    client.force_login(world.alice)
    assert "acme/llama-3-8b@1.0.0" in client.get("/regions/artifacts/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_garbage_collection_spares_what_deployments_use(world, chat_model, home, make_region, s3_endpoints):
    from datetime import timedelta

    from django.utils import timezone

    from artifacts.services.garbage import collect_garbage
    from regions.models import Deployment

    data = os.urandom(MiB)
    version = weights_version(world, chat_model, home, data)
    region = region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-gc"))
    assert replicate(replica_for(version, region).pk).state == "ready"
    long_ago = timezone.now() - timedelta(days=30)
    type(version).objects.filter(pk=version.pk).update(status="retired", status_changed_at=long_ago)
    deployment = Deployment.objects.create(
        owner=world.tenant_a,
        name="old",
        model=chat_model,
        version=version,
        gpu_type="L4",
        created_by_name="test",
    )
    assert collect_garbage(timedelta(days=7)) == []  # still deployed: kept
    store = store_from_config(region.object_store)
    assert store.size_of(blob_key(version.artifact_sha256)) == len(data)
    Deployment.objects.filter(pk=deployment.pk).update(state="deleted")
    assert collect_garbage(timedelta(days=60)) == []  # retired too recently for this retention
    assert collect_garbage(timedelta(days=7)) == [f"{version}@eu-west-1"]
    assert store.size_of(blob_key(version.artifact_sha256)) is None and not ArtifactReplica.objects.exists()
    assert AuditEvent.objects.filter(action="artifact.replica_deleted").count() == 1


def test_ingest_from_a_directory_an_http_server_and_s3(
    world, chat_model, home, s3_endpoints, tmp_path, monkeypatch
):
    import functools
    import http.server
    import threading

    from artifacts.services.ingest import ingest

    model_dir = tmp_path / "src-model"
    model_dir.mkdir()
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(7 * MiB)}
    for name, content in files.items():
        (model_dir / name).write_bytes(content)
    manifest = [
        {"path": n, "sha256": hashlib.sha256(c).hexdigest(), "size_bytes": len(c)} for n, c in files.items()
    ]
    actor = principal(world.alice)
    from_dir = register(
        chat_model, actor, "1.0.0", artifact_uri=f"file://{model_dir}", artifact_manifest=manifest
    )
    assert ingest(from_dir.pk) == "ingested"
    assert all(home.size_of(blob_key(f["sha256"])) == f["size_bytes"] for f in manifest)

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(model_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        other = os.urandom(MiB)
        (model_dir / "other.bin").write_bytes(other)
        url = f"http://127.0.0.1:{server.server_address[1]}/other.bin"
        from_http = register(
            chat_model,
            actor,
            "2.0.0",
            artifact_uri=url,
            sha=hashlib.sha256(other).hexdigest(),
            artifact_size_bytes=len(other),
            artifact_manifest=[],
        )
        assert ingest(from_http.pk) == "ingested"
    finally:
        server.shutdown()

    s3 = s3_client(endpoint_url=s3_endpoints[1], region_name="us-east-1")
    s3.create_bucket(Bucket="vendor")
    payload = os.urandom(2 * MiB)
    s3.put_object(Bucket="vendor", Key="llama/weights.bin", Body=payload)
    monkeypatch.setenv("ARTIFACT_SOURCE_S3_ENDPOINT", s3_endpoints[1])
    from_s3 = register(
        chat_model,
        actor,
        "3.0.0",
        artifact_uri="s3://vendor/llama/weights.bin",
        sha=hashlib.sha256(payload).hexdigest(),
        artifact_size_bytes=len(payload),
        artifact_manifest=[],
    )
    assert ingest(from_s3.pk) == "ingested"
    assert b"".join(home.stream(blob_key(from_s3.artifact_sha256))) == payload


@pytest.mark.django_db(transaction=True)
def test_staging_a_version_starts_copies_ahead_only_where_it_may_be_stored(
    world, chat_model, home, make_region, s3_endpoints
):
    from registry.services.lifecycle import version_transition
    from registry.services.reports import report_submit
    from tests.support.registry import GOOD_METRICS

    actor = principal(world.alice)
    version = weights_version(world, chat_model, home, os.urandom(MiB))  # allowed in EU and CH
    eu = region_with_store(make_region, "eu-west-1", "EU", bucket(s3_endpoints[0], "eu-ahead"))
    region_with_store(make_region, "us-east-1", "US", bucket(s3_endpoints[0], "us-ahead"))
    make_region("eu-central-1", "EU")  # no object store: serves file:// artifacts, nothing to copy
    report_submit(actor=actor, version=version, **GOOD_METRICS)
    for state in ("validating", "validated"):
        version_transition(actor=actor, version=version, to=state)
    assert not ArtifactReplica.objects.exists()
    version_transition(actor=actor, version=version, to="staged")
    assert list(ArtifactReplica.objects.values_list("region__code", flat=True)) == [eu.code]


@pytest.fixture
def shared_home(home, monkeypatch):
    """The home store, also for worker processes started after this fixture."""
    monkeypatch.setenv("ARTIFACT_HOME_STORE", json.dumps({"kind": "local", "root": str(home.root)}))
    return home


@pytest.mark.django_db(transaction=True)
def test_the_periodic_pass_resumes_dead_copies_and_retries_failures_after_their_backoff(
    world, chat_model, shared_home, make_region, s3_endpoints, celery_worker
):
    version = weights_version(world, chat_model, shared_home, os.urandom(6 * MiB))
    stores = {code: bucket(s3_endpoints[0], f"periodic-{code}") for code in ("a", "b", "c", "d")}
    regions = {
        code: region_with_store(make_region, f"eu-{code}-1", "EU", store) for code, store in stores.items()
    }
    past = timezone.now() - timedelta(minutes=30)
    replicas = {code: replica_for(version, region) for code, region in regions.items()}
    scenarios = {
        "a": {"state": "copying", "lease_until": past},  # its worker died mid-copy
        "b": {"state": "failed", "attempts": 2, "updated_at": past},  # due: backoff was 1 min
        "c": {"state": "failed", "attempts": 5, "updated_at": past},  # out of attempts: an operator retries
        "d": {"state": "failed", "attempts": 1, "updated_at": timezone.now()},  # backoff not over yet
    }
    for code, fields in scenarios.items():
        ArtifactReplica.objects.filter(pk=replicas[code].pk).update(**fields)

    assert sorted(resume_replication()) == sorted([replicas["a"].pk, replicas["b"].pk])
    states = lambda: {c: ArtifactReplica.objects.get(pk=r.pk).state for c, r in replicas.items()}  # noqa: E731
    wait_for(lambda: states()["a"] == states()["b"] == "ready", timeout=60)
    assert states() == {"a": "ready", "b": "ready", "c": "failed", "d": "failed"}


def test_two_uploads_of_the_same_content_completing_together_both_succeed(tmp_path, monkeypatch):
    """Two versions sharing weights are ingested at once: the second completion runs whole while the first is
    about to move its file into place, and neither may take the other's file."""
    import hashlib
    from pathlib import Path

    from artifacts.drivers.stores import LocalStore

    store = LocalStore(tmp_path)
    data = b"the same weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    key = f"blobs/sha256/{sha}"
    first, second = store.begin(key), store.begin(key)
    parts = {upload: {1: store.put_part(key, upload, 1, data)} for upload in (first, second)}
    rename, interleaved = Path.rename, []

    def rename_after_the_other(self, target):  # type: ignore[no-untyped-def]
        if not interleaved and str(self).endswith(".partial"):
            interleaved.append(True)
            store.complete(key, second, parts[second], sha)  # the other ingest, start to end
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", rename_after_the_other)
    store.complete(key, first, parts[first], sha)
    assert interleaved and store.open(key).read() == data
    assert sorted(p.name for p in (tmp_path / "blobs" / "sha256").iterdir()) == [sha]
