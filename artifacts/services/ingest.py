"""Ingest: stream a newly registered version's files from its source URI into the platform's home store.

Sources: ``file://`` (a file or a model directory), ``s3://bucket/prefix`` (credentials and endpoint from
the standard AWS variables, or ``ARTIFACT_SOURCE_S3_ENDPOINT``) and ``http(s)://``. Each file is hashed
while it streams; a file whose SHA-256 differs from the one declared at registration is refused, the
upload aborted, and the version rejected (audited, with the reason). A file whose bytes the home store
already holds is read and hashed all the same (the store is shared by every tenant: a digest alone proves
nothing), but not uploaded again.
"""

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlparse

import requests
from django.conf import settings

from artifacts.drivers.stores import ObjectStore, blob_key, s3_client
from artifacts.services.replication import home_store
from core.choices import AuditSource
from core.errors import InvalidTransition, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record
from regions.drivers.base import DriverError
from registry.choices import WeightsCheck
from registry.models import ModelVersion
from registry.selectors import version_files
from registry.services.lifecycle import version_reject
from registry.sources import check_opened, check_readable, check_source

SYSTEM = Principal.system("ingest", source=AuditSource.TASK)
MAX_REDIRECTS = 5


def _files(version: ModelVersion) -> list[tuple[str, str, int]]:
    """(source URI, sha256, size) of every file to ingest."""
    return [(f.source, f.sha256, f.size_bytes) for f in version_files(version)]


def _read(uri: str, part_size: int) -> Iterator[bytes]:
    """The bytes at ``uri``, which ``ingest`` checked against the allow-list before any read."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        with Path(parsed.path).open("rb") as handle:
            check_opened(handle, parsed.path)
            while chunk := handle.read(part_size):
                yield chunk
    elif parsed.scheme in {"http", "https"}:
        with _get(uri) as response:
            yield from response.iter_content(part_size)
    elif parsed.scheme == "s3":
        client = s3_client(endpoint_url=os.environ.get("ARTIFACT_SOURCE_S3_ENDPOINT") or None)
        body = client.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"]
        while chunk := body.read(part_size):
            yield chunk
    else:
        raise DriverError(f"cannot ingest from {uri}", permanent=True)


def _get(uri: str) -> requests.Response:
    """GET, following redirects only to allowed sources: one hop from an allowed host must not reach an
    internal address (a hub's CDN, where it redirects, must be listed too)."""
    for _ in range(MAX_REDIRECTS + 1):
        response = requests.get(uri, stream=True, timeout=(5, 60), allow_redirects=False)
        if not response.is_redirect:
            response.raise_for_status()
            return response
        response.close()
        uri = urljoin(uri, response.headers["location"])
        check_source(uri)
    raise DriverError(f"more than {MAX_REDIRECTS} redirects", permanent=True)


def _parts(chunks: Iterator[bytes], part_size: int) -> Iterator[bytes]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= part_size:
            yield buffer[:part_size]
            buffer = buffer[part_size:]
    yield buffer


def _ingest_file(home: ObjectStore, uri: str, sha256: str, part_size: int) -> None:
    key = blob_key(sha256)
    parts = _parts(_read(uri, part_size), part_size)
    if home.size_of(key) is not None:
        # Stored already, by another version (maybe another tenant's): the source is read all the same, or
        # naming a digest would be enough to be served someone else's weights. Only the upload is saved.
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        matches = digest.hexdigest() == sha256
    else:
        matches = _upload(home, key, parts, sha256)
    if not matches:
        # Never the digest found: the reason is shown to the tenant, and would tell it the SHA-256 of any
        # file or URL it names (a way to learn what it may not read, and to register it as its own).
        raise ValueError(f"{uri} does not have the declared SHA-256 {sha256}")


def _upload(home: ObjectStore, key: str, parts: Iterator[bytes], sha256: str) -> bool:
    """Stream ``parts`` into ``key``, kept only if they hash to ``sha256`` (False: aborted)."""
    upload, digest, etags = home.begin(key), hashlib.sha256(), {}
    try:
        for number, part in enumerate(parts, start=1):
            digest.update(part)
            if part or number == 1:
                etags[number] = home.put_part(key, upload, number, part)
    except BaseException:
        home.abort(key, upload)
        raise
    if digest.hexdigest() != sha256:
        home.abort(key, upload)
        return False
    home.complete(key, upload, etags, sha256)
    return True


def ingest(version_id: int) -> str:
    """Returns "ingested", or "rejected" when a file's checksum does not match its declaration or its
    source is not (or no longer) allowed: every source is checked first, even one whose bytes the home
    store already holds."""
    version = ModelVersion.objects.select_related("model__owner").get(pk=version_id)
    home, part_size = home_store(), settings.ARTIFACT_COPY_TUNING["part_size"]
    files = _files(version)
    try:
        for uri, _, _ in files:
            check_readable(uri)
        for uri, sha256, _ in files:
            _ingest_file(home, uri, sha256, part_size)
    except ValueError as exc:
        return _refuse(version, f"checksum mismatch at ingest: {exc}")
    except ValidationFailed as exc:  # the list narrowed since registration, a link or a redirect leads out
        return _refuse(version, f"refused at ingest: {exc.message}")
    ModelVersion.objects.filter(pk=version.pk).update(weights_check=WeightsCheck.VERIFIED)
    return "ingested"


def _refuse(version: ModelVersion, reason: str) -> str:
    """Refuse the weights for good (replication never copies them out of the home store) and reject the
    version; one promoted meanwhile (past validating) cannot be rejected, so the refusal is audited."""
    ModelVersion.objects.filter(pk=version.pk).update(weights_check=WeightsCheck.REFUSED)
    version.refresh_from_db(fields=["status"])  # it may have moved while its files streamed
    try:
        version_reject(actor=SYSTEM, version=version, reason=reason)
    except InvalidTransition:
        audit_record(
            actor=SYSTEM,
            action="model_version.weights_refused",
            target=version,
            tenant=version.model.owner,
            message=reason,
        )
    return "rejected"
