"""Object stores behind one interface: S3 (any S3-compatible endpoint, through boto3) and a local folder.

Objects are content-addressed: a file with SHA-256 ``h`` lives at ``blobs/sha256/<h>``, so copying the
same bytes twice is a no-op. Our own SHA-256 travels as object metadata, because a multipart upload's S3
checksum is a composite of the parts, not the file's digest. Copies go part by
part through ``MultipartUpload`` so an interrupted transfer resumes where it stopped.
"""

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import boto3
import botocore.config
import botocore.exceptions
from s3transfer.futures import TransferFuture
from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber

from core.errors import ValidationFailed
from regions.drivers.base import DriverError

CHUNK = 1024 * 1024


def blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256}"


class ObjectStore(Protocol):
    @property
    def label(self) -> str: ...

    def size_of(self, key: str) -> int | None: ...  # None: absent

    def read_range(self, key: str, start: int, end: int) -> bytes: ...  # end exclusive

    def stream(self, key: str) -> Iterator[bytes]: ...

    def open(self, key: str) -> BinaryIO: ...  # a readable stream of the whole object

    def read_parts(self, key: str, part_size: int) -> Iterator[bytes]: ...  # whole parts, in order

    def begin(self, key: str) -> str: ...

    def parts_done(self, key: str, upload_id: str) -> dict[int, str]: ...

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str: ...

    def complete(self, key: str, upload_id: str, parts: dict[int, str], sha256: str) -> None: ...

    def abort(self, key: str, upload_id: str) -> None: ...

    def delete(self, key: str) -> None: ...

    def usage_bytes(self) -> int: ...


@dataclass(frozen=True)
class Blobs:
    """A store read by content address: a host fills its model cache from it (regions.hooks.BlobReader)."""

    store: ObjectStore

    @property
    def label(self) -> str:
        return self.store.label

    def stream(self, sha256: str) -> Iterator[bytes]:
        return self.store.stream(blob_key(sha256))


def sha256_of(store: ObjectStore, key: str) -> str:
    digest = hashlib.sha256()
    for chunk in store.stream(key):
        digest.update(chunk)
    return digest.hexdigest()


@dataclass
class LocalStore:
    """A folder (the embedded default, and bare-metal hosts with shared storage)."""

    root: Path

    @property
    def label(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key

    def size_of(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.exists() else None

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self._path(key).open("rb") as handle:
            handle.seek(start)
            return handle.read(end - start)

    def stream(self, key: str) -> Iterator[bytes]:
        return self.read_parts(key, CHUNK)

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def read_parts(self, key: str, part_size: int) -> Iterator[bytes]:
        with self._path(key).open("rb") as handle:
            while chunk := handle.read(part_size):
                yield chunk

    def _parts(self, key: str, upload_id: str) -> Path:
        return self.root / ".uploads" / upload_id

    def begin(self, key: str) -> str:
        upload_id = hashlib.sha256(f"{key}{os.urandom(8).hex()}".encode()).hexdigest()[:24]
        self._parts(key, upload_id).mkdir(parents=True)
        return upload_id

    def parts_done(self, key: str, upload_id: str) -> dict[int, str]:
        folder = self._parts(key, upload_id)
        return {int(p.stem): p.stem for p in folder.glob("*.part")} if folder.exists() else {}

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        folder = self._parts(key, upload_id)
        (folder / f"{number:05d}.tmp").write_bytes(data)
        (folder / f"{number:05d}.tmp").rename(
            folder / f"{number:05d}.part"
        )  # atomic: a part is whole or absent
        return str(number)

    def complete(self, key: str, upload_id: str, parts: dict[int, str], sha256: str) -> None:
        folder, target = self._parts(key, upload_id), self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        # One partial file per upload: two ingests of the same content (two versions sharing weights) may
        # complete at once; each renames its own whole copy onto the content address, and either is right.
        partial = target.with_name(f"{target.name}.{upload_id}.partial")
        with partial.open("wb") as out:
            for number in sorted(parts):
                with (folder / f"{number:05d}.part").open("rb") as part:
                    shutil.copyfileobj(part, out, CHUNK)
        partial.rename(target)
        shutil.rmtree(folder, ignore_errors=True)

    def abort(self, key: str, upload_id: str) -> None:
        shutil.rmtree(self._parts(key, upload_id), ignore_errors=True)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def usage_bytes(self) -> int:
        blobs = self.root / "blobs"
        return sum(p.stat().st_size for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else 0


@dataclass
class S3Store:
    """A bucket on any S3-compatible endpoint; credentials are referenced by environment variable names."""

    bucket: str
    client: Any
    endpoint_url: str = ""
    checks_part_checksums = True  # the server validates each part's checksum on upload

    @property
    def label(self) -> str:
        return f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def size_of(self, key: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise

    def read_range(self, key: str, start: int, end: int) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        return bytes(body.read())

    def stream(self, key: str) -> Iterator[bytes]:
        return self.read_parts(key, CHUNK)

    def open(self, key: str) -> BinaryIO:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"]  # type: ignore[no-any-return]

    def read_parts(self, key: str, part_size: int) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        while chunk := body.read(part_size):
            while len(chunk) < part_size and (more := body.read(part_size - len(chunk))):
                chunk += more  # a short read is not the end: only the last part may be small
            yield chunk

    def begin(self, key: str) -> str:
        return str(self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"])

    def parts_done(self, key: str, upload_id: str) -> dict[int, str]:
        done: dict[int, str] = {}
        paginator = self.client.get_paginator("list_parts")
        for page in paginator.paginate(Bucket=self.bucket, Key=key, UploadId=upload_id):
            done.update({part["PartNumber"]: part["ETag"] for part in page.get("Parts", [])})
        return done

    def pending_upload(self, key: str) -> str | None:
        """The newest unfinished multipart upload of ``key`` (one a crashed worker left behind)."""
        reply = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=key)
        uploads = sorted(
            (u for u in reply.get("Uploads", []) if u["Key"] == key), key=lambda u: u["Initiated"]
        )
        return str(uploads[-1]["UploadId"]) if uploads else None

    def upload_stream(
        self,
        key: str,
        stream: BinaryIO,
        size: int,
        tuning: tuple[int, int],
        report: Callable[[int], None],
    ) -> None:
        """Upload a stream through s3transfer's pipeline (measured fastest here: it reads ahead while parts
        are in flight), calling ``report(bytes sent)`` every two seconds from the calling thread.

        ``tuning`` is (part size, concurrency). The size is given, so s3transfer keeps that part size: the
        same split a resume uses on the upload that a crashed worker leaves behind.
        """
        part_size, concurrency = tuning
        config = TransferConfig(
            multipart_threshold=part_size,
            multipart_chunksize=part_size,
            max_request_concurrency=concurrency,
        )
        sent = _Sent(size)
        with TransferManager(self.client, config) as manager:
            future = manager.upload(stream, self.bucket, key, subscribers=[sent])
            while not _finished(future, timeout=2):
                report(sent.bytes)
            future.result()

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        # botocore sends a CRC32 checksum with each part by default (request_checksum_calculation
        # "when_supported"); the server recomputes it and refuses a part that arrived damaged.
        reply = self.client.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
        )
        return str(reply["ETag"])

    def copy_part(
        self, key: str, upload_id: str, number: int, source: "S3Store", start: int, end: int
    ) -> str:
        """Server-side copy of a byte range when both buckets live behind the same endpoint."""
        reply = self.client.upload_part_copy(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            CopySource={"Bucket": source.bucket, "Key": key},
            CopySourceRange=f"bytes={start}-{end - 1}",
        )
        return str(reply["CopyPartResult"]["ETag"])

    def complete(self, key: str, upload_id: str, parts: dict[int, str], sha256: str) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": parts[n]} for n in sorted(parts)]},
        )

    def abort(self, key: str, upload_id: str) -> None:
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def usage_bytes(self) -> int:
        total = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix="blobs/"
        ):
            total += sum(item["Size"] for item in page.get("Contents", []))
        return total


def s3_client(
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Any:
    """The one place an S3 client is built: explicit connect/read timeouts, bounded retries in boto's
    standard mode, and a pool wide enough for parallel part copies. Credentials None: the standard chain."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_name,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=botocore.config.Config(
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
        ),
    )


def store_from_config(config: dict[str, Any]) -> ObjectStore:
    """Build a store from a region's (or the home store's) configuration; credentials by reference."""
    kind = config.get("kind")
    if kind == "local":
        return LocalStore(Path(config["root"]))
    if kind == "s3":
        access = os.environ.get(config.get("access_key_env", ""), "") or None
        secret = os.environ.get(config.get("secret_key_env", ""), "") or None
        client = s3_client(
            endpoint_url=config.get("endpoint_url") or None,
            region_name=config.get("region_name", "us-east-1"),
            access_key=access,
            secret_key=secret,
        )
        return S3Store(config["bucket"], client, config.get("endpoint_url", ""))
    raise DriverError(f"unknown object store kind {kind!r}", permanent=True)


def validate_store_config(config: dict[str, Any]) -> None:
    if not config:
        return
    kind = config.get("kind")
    required = {"local": {"root"}, "s3": {"bucket"}}.get(str(kind))
    if required is None:
        raise ValidationFailed("object_store.kind must be 's3' or 'local'.")
    allowed = required | {"kind", "endpoint_url", "region_name", "access_key_env", "secret_key_env"}
    if not required <= set(config) or set(config) - allowed:
        raise ValidationFailed(
            f"object_store of kind {kind} takes {', '.join(sorted(allowed))} "
            f"({', '.join(sorted(required))} required)."
        )


class _Sent(BaseSubscriber):  # type: ignore[misc]
    """Tells s3transfer the size (so it keeps our part size) and counts the bytes sent."""

    def __init__(self, size: int):
        self.size, self.bytes = size, 0

    def on_queued(self, future: TransferFuture, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)

    def on_progress(self, future: TransferFuture, bytes_transferred: int, **kwargs: Any) -> None:
        self.bytes += bytes_transferred  # from s3transfer's threads; a progress figure, not a ledger


def _finished(future: TransferFuture, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not future.done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
