"""Ingest proves a version's weights before they leave the home store, which every tenant shares by
digest: a mismatch rejects the version, a digest named without its bytes gets nothing copied anywhere."""

import hashlib

from artifacts.drivers.stores import blob_key, store_from_config
from artifacts.services.replication import HELD, due_replicas, replica_for, replicate
from core.models import AuditEvent
from tests.support.artifacts import put_blob, region_with_store
from tests.support.principals import principal
from tests.support.registry import advance, register, register_file


def test_ingest_rejects_a_version_whose_bytes_do_not_match(world, chat_model, home, tmp_path):
    from artifacts.services.ingest import ingest

    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"not what was declared")
    version = register(
        chat_model,
        principal(world.alice),
        "1.0.0",
        artifact_uri=f"file://{weights}",
        sha="e" * 64,
        artifact_manifest=[],
    )
    assert ingest(version.pk) == "rejected"
    version.refresh_from_db()
    assert version.status == "rejected" and home.size_of(blob_key("e" * 64)) is None
    event = AuditEvent.objects.get(action="model_version.rejected")
    assert "checksum mismatch at ingest" in event.message
    actual = hashlib.sha256(b"not what was declared").hexdigest()
    assert actual not in event.message and actual[:12] not in event.message  # no oracle of any file's digest


def test_a_digest_the_home_store_holds_is_not_enough_to_claim_its_bytes(
    settings, client, world, chat_model, home, make_region, tmp_path
):
    """The home store is shared by every tenant, by digest: a version naming another tenant's digest is
    copied nowhere until ingest has read those bytes from its own source, and is rejected when it cannot;
    a version that has them is verified without a second upload, then copied."""
    from artifacts.services.ingest import ingest
    from registry.services.models import model_register

    settings.ARTIFACT_INGEST_ON_REGISTER = True
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    weights = tmp_path / "a" / "weights.bin"
    weights.write_bytes(b"tenant A's fine-tuned weights")
    theirs = register_file(chat_model, principal(world.alice), "1.0.0", weights)
    sha = theirs.artifact_sha256
    assert theirs.weights_check == "pending"
    assert ingest(theirs.pk) == "ingested"
    blob = tmp_path / "home" / blob_key(sha)
    stored = blob.stat().st_mtime_ns

    us = region_with_store(make_region, "us-east-1", "US", {"kind": "local", "root": str(tmp_path / "us")})
    us_store = store_from_config(us.object_store)
    bob = principal(world.bob)
    copycat = model_register(actor=bob, owner=world.tenant_b, name="copycat", task="chat")
    decoy = tmp_path / "b" / "decoy.bin"
    decoy.write_bytes(b"anything at all")
    claim = register_file(copycat, bob, "1.0.0", decoy, sha=sha, allowed_jurisdictions=["US"])
    replica = replicate(replica_for(claim, us).pk)  # before its ingest: nothing moves
    assert (replica.state, replica.last_error) == ("pending", HELD["pending"])
    assert due_replicas() == []  # nor does the periodic pass send it
    assert ingest(claim.pk) == "rejected"
    claim.refresh_from_db()
    assert (claim.status, claim.weights_check) == ("rejected", "refused")
    assert "checksum mismatch at ingest" in AuditEvent.objects.get(action="model_version.rejected").message
    replica = replicate(replica.pk)
    assert (replica.state, replica.last_error) == ("pending", HELD["refused"])
    assert us_store.size_of(blob_key(sha)) is None
    client.force_login(world.bob)
    assert "Refused at ingest" in client.get("/registry/globex/copycat/1.0.0/").content.decode()
    client.force_login(world.alice)  # the other tenant learns nothing of it
    assert client.get("/registry/globex/copycat/1.0.0/").status_code == 404

    same = tmp_path / "b" / "weights.bin"
    same.write_bytes(weights.read_bytes())
    honest = register_file(copycat, bob, "2.0.0", same, allowed_jurisdictions=["US"])
    waiting = replica_for(honest, us)
    assert due_replicas() == []
    assert ingest(honest.pk) == "ingested"
    honest.refresh_from_db()
    assert honest.weights_check == "verified"
    assert blob.stat().st_mtime_ns == stored  # not uploaded again
    assert due_replicas() == [waiting.pk]  # sent by the next periodic pass
    assert replicate(waiting.pk).state == "ready"
    assert us_store.size_of(blob_key(sha)) == len(weights.read_bytes())


def test_a_version_promoted_before_its_ingest_refused_it_keeps_its_weights_home(
    settings, world, chat_model, home, make_region, tmp_path
):
    """Ingest cannot reject a version already promoted past validating: its weights stay unverified, so no
    region ever gets them, and the refusal is audited."""
    from artifacts.services.ingest import ingest
    from artifacts.services.scheduling import weights_gate

    settings.ARTIFACT_INGEST_ON_REGISTER = True
    sha = put_blob(home, b"somebody's weights")
    decoy = tmp_path / "decoy.bin"
    decoy.write_bytes(b"not those")
    version = register_file(chat_model, principal(world.alice), "1.0.0", decoy, sha=sha)
    advance(version, principal(world.operator), "staged")
    assert ingest(version.pk) == "rejected"
    version.refresh_from_db()
    assert (version.status, version.weights_check) == ("staged", "refused")
    assert "checksum mismatch" in AuditEvent.objects.get(action="model_version.weights_refused").message
    eu = region_with_store(make_region, "eu-west-1", "EU", {"kind": "local", "root": str(tmp_path / "eu")})
    assert replicate(replica_for(version, eu).pk).state == "pending"
    assert store_from_config(eu.object_store).size_of(blob_key(sha)) is None
    wait = weights_gate(version, eu)  # what a deployment's target there shows: failed, for good
    assert wait is not None and wait.message == HELD["refused"] and wait.permanent
