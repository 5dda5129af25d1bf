"""The allow-list of artifact sources: one rule (registry.sources), applied at registration, at ingest and
where the process driver serves a model directory from the host."""

import hashlib

import pytest

from artifacts.drivers.stores import LocalStore, blob_key
from core.errors import ValidationFailed
from core.models import AuditEvent
from regions.drivers.base import DriverError
from regions.drivers.process import ProcessConfig, ProcessDriver
from registry.models import ModelVersion
from registry.sources import check_readable, source_allowed
from tests.regions.test_process_driver import spec
from tests.support.principals import principal
from tests.support.registry import register, version_payload

SOURCES = [
    "file:///srv/models",
    "s3://models-upload/",
    "https://hub.example.com/org/",
    "http://10.0.0.5:9000",
]


@pytest.fixture
def narrow(settings):
    settings.ARTIFACT_SOURCES = SOURCES


@pytest.mark.parametrize(
    "uri, allowed",
    [
        ("file:///srv/models", True),
        ("file:///srv/models/llama/config.json", True),
        ("file:///srv/models-private/llama", False),  # a prefix matches whole path segments
        ("file:///srv/models/../../etc/passwd", False),
        ("file:///srv/models/./llama", True),
        ("https://hub.example.com/org/%2e%2e/other-org/llama", False),  # "..", as a server decodes it
        ("https://hub.example.com/org/llama%00.bin", False),
        ("https://hub.example.com@evil.test/org/llama", False),  # the host is evil.test
        ("file:///etc/passwd", False),
        ("file://otherhost/srv/models/llama", False),
        ("s3://models-upload/llama/weights.bin", True),
        ("s3://models-upload-2/llama", False),
        ("s3://other/models-upload/llama", False),
        ("https://hub.example.com/org/llama/weights.bin", True),
        ("https://HUB.example.com/org/llama", True),  # host names are case-insensitive
        ("https://hub.example.com/orgx/llama", False),
        ("https://hub.example.com.evil.test/org/llama", False),
        ("https://user@hub.example.com/org/llama", True),
        ("http://hub.example.com/org/llama", False),  # scheme counts
        ("http://10.0.0.5:9000/bucket/w.bin", True),
        ("http://10.0.0.5/bucket/w.bin", False),  # so does the port
        ("http://10.0.0.5:99999/bucket/w.bin", False),  # not a port at all
        ("http://169.254.169.254/latest/meta-data/", False),
        ("file:///srv/models/llama\x00.bin", False),
        ("gs://models-upload/llama", False),
        ("ftp://models-upload/llama", False),
        ("", False),
    ],
)
def test_a_source_must_lie_under_an_allowed_prefix(narrow, uri, allowed):
    assert source_allowed(uri) is allowed


def test_a_bare_scheme_admits_every_bucket_but_nothing_else(settings):
    settings.ARTIFACT_SOURCES = ["s3://"]
    assert source_allowed("s3://any-bucket/key") and not source_allowed("https://any-bucket/key")
    settings.ARTIFACT_SOURCES = []
    assert not source_allowed("s3://any-bucket/key")


def test_a_symlink_leading_out_of_an_allowed_folder_is_refused_when_read(settings, tmp_path):
    allowed, outside = tmp_path / "models", tmp_path / "private"
    allowed.mkdir(), outside.mkdir()
    (outside / "weights.bin").write_bytes(b"another tenant's weights")
    (allowed / "weights.bin").write_bytes(b"mine")
    (allowed / "escape").symlink_to(outside, target_is_directory=True)
    settings.ARTIFACT_SOURCES = [f"file://{allowed}"]
    check_readable(f"file://{allowed}/weights.bin")
    assert source_allowed(f"file://{allowed}/escape/weights.bin")  # what registration can see
    with pytest.raises(ValidationFailed):
        check_readable(f"file://{allowed}/escape/weights.bin")  # what ingest and the driver check


def test_the_api_refuses_a_version_from_elsewhere_and_writes_nothing(narrow, world, api, chat_model):
    client = api(world.alice)
    events = AuditEvent.objects.count()
    url = "/api/v1/models/acme/llama-3-8b/versions/"
    for uri in ("file:///etc/", "http://169.254.169.254/latest/", "s3://platform-secrets/"):
        response = client.post(url, version_payload(artifact_uri=uri), format="json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["detail"] == {"artifact_uri": ["not an allowed artifact source"]}
        assert "s3://models-upload/" in error["message"]  # it says what is accepted
    assert not ModelVersion.objects.exists() and AuditEvent.objects.count() == events
    ok = client.post(url, version_payload(artifact_uri="s3://models-upload/llama/1.0.0/"), format="json")
    assert ok.status_code == 201, ok.content


def test_ingest_rejects_a_version_whose_source_is_no_longer_allowed(settings, world, chat_model, tmp_path):
    from artifacts.services.ingest import ingest

    settings.ARTIFACT_HOME_STORE = {"kind": "local", "root": str(tmp_path / "home")}
    weights = tmp_path / "models" / "weights.bin"
    weights.parent.mkdir()
    weights.write_bytes(b"weights")
    sha = hashlib.sha256(b"weights").hexdigest()
    settings.ARTIFACT_SOURCES = [f"file://{weights.parent}"]
    version = register(
        chat_model,
        principal(world.alice),
        "1.0.0",
        artifact_uri=f"file://{weights}",
        sha=sha,
        artifact_manifest=[],
    )
    settings.ARTIFACT_SOURCES = ["s3://models-upload/"]  # the operator narrowed the list since
    assert ingest(version.pk) == "rejected"
    version.refresh_from_db()
    assert version.status == "rejected"
    assert LocalStore(tmp_path / "home").size_of(blob_key(sha)) is None  # not a byte read
    event = AuditEvent.objects.get(action="model_version.rejected")
    assert "refused at ingest" in event.message and "not under a source" in event.message


def test_the_process_driver_serves_no_folder_outside_the_list(settings, tmp_path, tiny_model_dir):
    driver = ProcessDriver(ProcessConfig(state_dir=str(tmp_path / "state"), engine="simulator"))
    settings.ARTIFACT_SOURCES = ["file:///srv/models"]
    with pytest.raises(DriverError, match="not under a source") as refused:
        driver._model_path(spec("cp-1-elsewhere", tiny_model_dir))
    assert refused.value.permanent
    settings.ARTIFACT_SOURCES = [f"file://{tiny_model_dir.parent}"]
    assert driver._model_path(spec("cp-1-allowed", tiny_model_dir)) == str(tiny_model_dir)
