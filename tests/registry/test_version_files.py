"""A version's files are one list (``registry.selectors.version_files``): ingest fetches, replication copies
and the engine's workload names exactly those files, whatever the manifest declares."""

import pytest

from artifacts.services.ingest import _files
from artifacts.services.replication import blobs_of
from regions.workloads import model_files
from registry.models import ModelVersion
from registry.selectors import VersionFile, version_files

A, B, C = "a" * 64, "b" * 64, "c" * 64


def version(manifest: list[dict[str, object]]) -> ModelVersion:
    return ModelVersion(
        artifact_uri="s3://models/llama/1.0.0/",
        artifact_sha256=A,
        artifact_size_bytes=4096,
        artifact_format="safetensors",
        artifact_manifest=manifest,
    )


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            [{"path": "config.json", "sha256": B, "size_bytes": 654}, {"path": "weights.bin", "sha256": C}],
            [
                VersionFile("config.json", B, 654, "s3://models/llama/1.0.0/config.json"),
                VersionFile("weights.bin", C, 0, "s3://models/llama/1.0.0/weights.bin"),
            ],
        ),
        ([], [VersionFile("model.safetensors", A, 4096, "s3://models/llama/1.0.0/")]),
        # Files without a digest cannot be content-addressed; with none declared, the artifact is the file.
        ([{"path": "README.md"}], [VersionFile("model.safetensors", A, 4096, "s3://models/llama/1.0.0/")]),
        (
            [{"path": "README.md"}, {"path": "config.json", "sha256": B, "size_bytes": 654}],
            [VersionFile("config.json", B, 654, "s3://models/llama/1.0.0/config.json")],
        ),
    ],
)
def test_ingest_replication_and_the_workload_use_the_same_files(manifest, expected):
    found = version(manifest)
    assert version_files(found) == expected
    assert _files(found) == [(f.source, f.sha256, f.size_bytes) for f in expected]
    assert blobs_of(found) == [(f.sha256, f.size_bytes) for f in expected]
    assert model_files(found) == [[f.path, f.sha256] for f in expected]
