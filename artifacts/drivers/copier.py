"""Part-by-part, parallel, resumable copies between object stores, verified by SHA-256 at the destination.

A blob is copied as a multipart upload whose id is saved before the first part moves, so a worker that
dies mid-copy leaves the finished parts in place and the next attempt uploads only the missing ones.
Between two S3 buckets behind one endpoint the parts are copied server-side (UploadPartCopy) in parallel
and no byte passes through the worker. Otherwise the source is read once, sequentially (one request,
hashed with SHA-256 as it streams), and its parts are uploaded by ``concurrency`` threads: a fresh copy
into S3 through s3transfer's upload pipeline (faster than our own in bench/replication_bench.py), a
resumed one by our part loop, which skips the parts already there.
"""

import hashlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import BinaryIO

import botocore.exceptions

from artifacts.drivers.stores import ObjectStore, S3Store, blob_key, sha256_of
from regions.drivers.base import DriverError

MIN_PART = 5 * 1024 * 1024  # S3's smallest part (but the last)
MAX_PARTS = 10_000


@dataclass(frozen=True)
class CopyTuning:
    part_size: int = 8 * 1024 * 1024
    concurrency: int = 8

    def part_size_for(self, size: int) -> int:
        return max(self.part_size, MIN_PART, -(-size // MAX_PARTS))


def _ranges(size: int, part: int) -> list[tuple[int, int, int]]:
    return [(n + 1, start, min(start + part, size)) for n, start in enumerate(range(0, max(size, 1), part))]


def _same_endpoint(src: ObjectStore, dst: ObjectStore) -> bool:
    """Both are S3 buckets behind one endpoint, so the destination can copy parts server-side."""
    endpoint = getattr(dst, "endpoint_url", None)
    return isinstance(src, S3Store) and hasattr(dst, "copy_part") and endpoint == src.endpoint_url


@dataclass(frozen=True)
class CopyResult:
    moved: int  # bytes sent by this call (0: the blob was already there)
    verified: bool  # the destination's part checksums matched the bytes whose SHA-256 was checked


def copy_blob(
    src: ObjectStore,
    dst: ObjectStore,
    sha256: str,
    size: int,
    *,
    tuning: CopyTuning,
    upload_id: str | None,
    remember_upload: Callable[[str], None],
    progress: Callable[[int], None],
) -> CopyResult:
    """Copy one content-addressed blob.

    ``progress(bytes moved so far)`` is called every couple of seconds from the calling thread.
    """
    key = blob_key(sha256)
    if dst.size_of(key) == size:
        return CopyResult(0, True)  # content-addressed: verified when it was written
    part_size = tuning.part_size_for(size)
    same_endpoint = _same_endpoint(src, dst)
    if not same_endpoint and hasattr(dst, "upload_stream"):  # an S3 destination
        # s3transfer's uploads are found by key; only one worker holds a replica's lease.
        upload_id = upload_id or dst.pending_upload(key)  # type: ignore[attr-defined]
        if not upload_id:
            return _copy_managed(src, dst, key, sha256, size, part_size, tuning, progress)
    upload_id, done = _resume(dst, key, upload_id)
    remember_upload(upload_id)
    if same_endpoint:
        return _copy_server_side(src, dst, key, sha256, size, upload_id, done, part_size, tuning, progress)
    return _copy_streaming(src, dst, key, sha256, upload_id, done, part_size, tuning, progress)


class _Hashing:
    """A readable stream that hashes what passes and refuses to end on the wrong bytes.

    The check runs when the last byte is read, before s3transfer completes the upload, so a corrupt source
    makes the transfer fail (and s3transfer abort the upload) instead of publishing a wrong blob.
    """

    def __init__(self, stream: BinaryIO, sha256: str, size: int, hasher: ThreadPoolExecutor):
        self.stream, self.sha256, self.left, self.digest = stream, sha256, size, hashlib.sha256()
        self.hasher = hasher  # one thread: hashes in order, off the reading thread (hashlib drops the GIL)

    def read(self, amount: int = -1) -> bytes:
        data = self.stream.read(amount)
        self.hasher.submit(self.digest.update, data)
        self.left -= len(data)
        if self.left <= 0 or (not data and amount != 0):  # the expected end, or an early one
            self._check()
        return data

    def _check(self) -> None:
        self.hasher.submit(lambda: None).result()  # everything read so far is hashed
        actual = self.digest.hexdigest()
        if self.left != 0 or actual != self.sha256:
            raise DriverError(
                f"checksum mismatch at the source: expected {self.sha256[:12]}…, got {actual[:12]}…"
            )


def _copy_managed(
    src: ObjectStore,
    dst: ObjectStore,
    key: str,
    sha256: str,
    size: int,
    part_size: int,
    tuning: CopyTuning,
    progress: Callable[[int], None],
) -> CopyResult:
    with ThreadPoolExecutor(max_workers=1) as hasher:
        stream = _Hashing(src.open(key), sha256, size, hasher)
        upload = dst.upload_stream  # type: ignore[attr-defined]
        upload(key, stream, size, (part_size, tuning.concurrency), progress)
        if dst.size_of(key) != size:  # the source ended early
            dst.delete(key)
            stream._check()
    return CopyResult(size, verified=True)  # botocore sent a CRC32 with every part; the server checked it


def _copy_server_side(
    src: ObjectStore,
    dst: ObjectStore,
    key: str,
    sha256: str,
    size: int,
    upload_id: str,
    done: dict[int, str],
    part_size: int,
    tuning: CopyTuning,
    progress: Callable[[int], None],
) -> CopyResult:
    parts = _ranges(size, part_size)
    etags = {n: done[n] for n in done if n <= len(parts)}
    lock, moved = threading.Lock(), [0]

    def one(number: int, start: int, end: int) -> None:
        etag = dst.copy_part(key, upload_id, number, src, start, end)  # type: ignore[attr-defined]
        with lock:
            etags[number] = etag
            moved[0] += end - start

    with ThreadPoolExecutor(max_workers=tuning.concurrency) as pool:
        _drain(
            pool,
            [pool.submit(one, *part) for part in parts if part[0] not in etags],
            lambda: progress(moved[0]),
        )
    dst.complete(key, upload_id, etags, sha256)
    return CopyResult(moved[0], False)


def _copy_streaming(
    src: ObjectStore,
    dst: ObjectStore,
    key: str,
    sha256: str,
    upload_id: str,
    done: dict[int, str],
    part_size: int,
    tuning: CopyTuning,
    progress: Callable[[int], None],
) -> CopyResult:
    """One sequential read of the source (hashed on the way), parts uploaded in parallel.

    An S3 destination checks each part against the CRC32 checksum sent with it and refuses a mismatch, and
    the stream's SHA-256 proves those were the right bytes: the copy is verified without reading it back.
    """
    digest, etags, numbers = hashlib.sha256(), dict(done), []
    lock, moved, slots = threading.Lock(), [0], threading.BoundedSemaphore(tuning.concurrency)

    def upload(number: int, data: bytes) -> None:
        try:
            etag = dst.put_part(key, upload_id, number, data)
            with lock:
                etags[number] = etag
                moved[0] += len(data)
        finally:
            slots.release()

    futures = []
    # One hashing thread keeps the parts in order and overlaps SHA-256 with reading and uploading
    # (hashlib releases the GIL on large buffers).
    with (
        ThreadPoolExecutor(max_workers=tuning.concurrency) as pool,
        ThreadPoolExecutor(max_workers=1) as hasher,
    ):
        for number, data in enumerate(_whole_parts(src.read_parts(key, part_size)), start=1):
            hasher.submit(digest.update, data)
            numbers.append(number)
            if number in done:
                continue  # uploaded by an earlier attempt
            slots.acquire()
            futures.append(pool.submit(upload, number, data))
            _raise_first_error(futures)
        _drain(pool, futures, lambda: progress(moved[0]))
        hasher.shutdown(wait=True)
    if digest.hexdigest() != sha256:
        dst.abort(key, upload_id)
        raise DriverError(
            f"checksum mismatch at the source: expected {sha256[:12]}…, got {digest.hexdigest()[:12]}…"
        )
    dst.complete(key, upload_id, {n: etags[n] for n in numbers}, sha256)
    return CopyResult(moved[0], verified=getattr(dst, "checks_part_checksums", False))


def _whole_parts(parts: Iterator[bytes]) -> Iterator[bytes]:
    """At least one part, so an empty file still completes an upload."""
    empty = True
    for part in parts:
        empty = False
        yield part
    if empty:
        yield b""


def _raise_first_error(futures: list[Future[None]]) -> None:
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]


def _drain(pool: ThreadPoolExecutor, futures: list[Future[None]], report: Callable[[], None]) -> None:
    """Wait for the parts, reporting progress from the calling thread, which owns the database connection."""
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, timeout=2, return_when=FIRST_EXCEPTION)
        for future in finished:
            future.result()
        report()


def _resume(dst: ObjectStore, key: str, upload_id: str | None) -> tuple[str, dict[int, str]]:
    if upload_id:
        try:
            return upload_id, dst.parts_done(key, upload_id)
        except botocore.exceptions.ClientError:
            pass  # the upload expired or was aborted: start over
    return dst.begin(key), {}


def verify_blob(dst: ObjectStore, sha256: str) -> None:
    actual = sha256_of(dst, blob_key(sha256))
    if actual != sha256:
        dst.delete(blob_key(sha256))
        raise DriverError(
            f"checksum mismatch at the destination: expected {sha256[:12]}…, got {actual[:12]}…"
        )
