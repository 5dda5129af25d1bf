"""The allow-list of artifact sources: one rule (registry.sources), applied at registration, at ingest and
where the process driver serves a model directory from the host."""

import hashlib
import http.server
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from artifacts.drivers.stores import LocalStore, blob_key
from core.errors import ValidationFailed
from core.models import AuditEvent
from regions.drivers.base import DriverError
from regions.drivers.process import ProcessConfig, ProcessDriver
from registry.models import ModelVersion
from registry.sources import check_opened, check_readable, source_allowed
from tests.support.artifacts import put_blob
from tests.support.principals import principal
from tests.support.regions import process_spec as spec
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
        ("https://user@hub.example.com/org/llama", False),  # no user names: parsers disagree on them
        ("https://internal.svc\\@hub.example.com/org/x", False),  # urllib3 would connect to internal.svc
        ("https://hub.example.com/org/a\\b", False),
        ("https://hub.example.com/org/ llama", False),
        ("https://hub.example.com/org/%0allama", False),
        ("https://hub.example.com/org/..;/other-org/llama", False),  # ".." to Tomcat-style servers
        ("s3://models-upload/./other/llama", False),  # a dot segment is a real key part in S3, refused
        ("http://[::1]:9000/bucket/w.bin", False),
        ("http://10.0.0.5:0/bucket/w.bin", False),  # port 0 is a port, not "no port"
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


def test_ipv6_hosts_keep_their_brackets(settings):
    settings.ARTIFACT_SOURCES = ["http://[::1]:9000/models/"]
    assert source_allowed("http://[::1]:9000/models/w.bin")
    assert not source_allowed("http://[::1:9000]/models/w.bin")  # another host that once looked the same


def test_prefixes_that_admit_nothing_are_named_by_the_system_check(settings):
    from django.core.checks import run_checks

    settings.ARTIFACT_SOURCES = ["file://var/models", "ftp://x/", "s3://models-upload/", "file://"]
    errors = [e for e in run_checks() if e.id == "registry.E001"]
    assert len(errors) == 1 and "file://var/models" in errors[0].msg and "ftp://x/" in errors[0].msg
    assert "s3://models-upload/" not in errors[0].msg
    assert source_allowed("file:///anything/at/all")  # "file://" alone: every file (wide, documented)


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
    with pytest.raises(ValidationFailed):
        check_readable(f"file://{allowed}")  # a model folder holding a link that leads out
    # A link swapped in after the check: what the open descriptor points at is checked.
    with (allowed / "escape" / "weights.bin").open("rb") as handle, pytest.raises(ValidationFailed):
        check_opened(handle, f"{allowed}/escape/weights.bin")
    with (allowed / "weights.bin").open("rb") as handle:
        check_opened(handle, f"{allowed}/weights.bin")


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
    settings.ARTIFACT_SOURCES = [f"file://{tmp_path / 'models'}"]
    served = shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    assert driver._model_path(spec("cp-1-allowed", served)) == str(served)
    (served / "tokenizer.json").unlink()
    (served / "tokenizer.json").symlink_to(tiny_model_dir / "tokenizer.json")  # a file inside leads out
    with pytest.raises(DriverError, match="not under a source"):
        driver._model_path(spec("cp-1-allowed", served))


def test_the_kubernetes_driver_syncs_no_uri_outside_the_list(settings):
    from regions.drivers.kubernetes import KubernetesConfig, render_manifests

    config = KubernetesConfig(namespace="llm", kubeconfig_file="/dev/null")
    workload = replace(spec("cp-1-chat", Path("/x")), model_uri="s3://platform-secrets/llama/")
    settings.ARTIFACT_SOURCES = ["s3://models-upload/"]
    with pytest.raises(DriverError, match="not under a source"):
        render_manifests(workload, config)  # no regional copy: the pod would read the URI itself
    settings.ARTIFACT_SOURCES = ["s3://platform-secrets/"]
    assert render_manifests(workload, config)


def test_ingest_checks_every_redirect_and_every_stored_blob(settings, world, chat_model, tmp_path):
    from artifacts.services.ingest import ingest

    settings.ARTIFACT_HOME_STORE = {"kind": "local", "root": str(tmp_path / "home")}

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    allowed = f"http://127.0.0.1:{server.server_address[1]}"
    settings.ARTIFACT_SOURCES = [allowed]
    try:
        actor = principal(world.alice)
        version = register(chat_model, actor, "1.0.0", artifact_uri=f"{allowed}/w.bin", artifact_manifest=[])
        assert ingest(version.pk) == "rejected"  # the redirect leads out of the list: not followed
    finally:
        server.shutdown()
    event = AuditEvent.objects.get(action="model_version.rejected")
    assert "refused at ingest" in event.message

    # Bytes the home store already holds: their source is checked before it is read to prove them.
    sha = put_blob(LocalStore(tmp_path / "home"), b"weights")
    stored = register(
        chat_model, actor, "2.0.0", artifact_uri=f"{allowed}/w2.bin", sha=sha, artifact_manifest=[]
    )
    settings.ARTIFACT_SOURCES = ["s3://models-upload/"]
    assert ingest(stored.pk) == "rejected"
