"""Object stores behind one interface: S3 (any S3-compatible endpoint, through boto3) and a local folder.

Objects are content-addressed: a file with SHA-256 ``h`` lives at ``blobs/sha256/<h>``, so copying the
same bytes twice is a no-op. Our own SHA-256 travels as object metadata, because a multipart upload's S3
checksum is a composite of the parts, not the file's digest (shared/REFERENCE.md §6). Copies go part by
part through ``MultipartUpload`` so an interrupted transfer resumes where it stopped.
"""

import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import boto3
import botocore.config
import botocore.exceptions

from controlplane.errors import ValidationFailed
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

    def read_parts(self, key: str, part_size: int) -> Iterator[bytes]: ...  # whole parts, in order

    def begin(self, key: str) -> str: ...

    def parts_done(self, key: str, upload_id: str) -> dict[int, str]: ...

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str: ...

    def complete(self, key: str, upload_id: str, parts: dict[int, str], sha256: str) -> None: ...

    def abort(self, key: str, upload_id: str) -> None: ...

    def delete(self, key: str) -> None: ...

    def usage_bytes(self) -> int: ...


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
        partial = target.with_suffix(".partial")
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


def store_from_config(config: dict[str, Any]) -> ObjectStore:
    """Build a store from a region's (or the home store's) configuration; credentials by reference."""
    kind = config.get("kind")
    if kind == "local":
        return LocalStore(Path(config["root"]))
    if kind == "s3":
        access = os.environ.get(config.get("access_key_env", ""), "") or None
        secret = os.environ.get(config.get("secret_key_env", ""), "") or None
        client = boto3.client(
            "s3",
            endpoint_url=config.get("endpoint_url") or None,
            region_name=config.get("region_name", "us-east-1"),
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=botocore.config.Config(
                connect_timeout=5, read_timeout=60, retries={"max_attempts": 3}, max_pool_connections=32
            ),
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
