"""Replicating a 1 GiB artifact between two local S3 endpoints: our copier against plain boto3.

Both endpoints are moto servers in their own processes on 127.0.0.1. The two sides run in one session,
alternating, on the same object:

- baseline: ``dst.upload_fileobj(src.get_object()["Body"])`` with boto3's default TransferConfig
  (what a script would do between two providers);
- ours: ``artifacts.drivers.copier.copy_blob``: one sequential read hashed with SHA-256, parts uploaded
  by 8 threads (8 MiB parts by default), resumable, each part's MD5 checked against the destination's
  ETag, so the copy is verified without reading it back.

    .venv/bin/python bench/replication_bench.py [--mib 1024] [--rounds 2]
"""

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

from artifacts.drivers.copier import CopyTuning, copy_blob  # noqa: E402
from artifacts.drivers.stores import S3Store, blob_key, s3_client  # noqa: E402

MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_endpoint() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def client(url: str):  # type: ignore[no-untyped-def]
    return s3_client(endpoint_url=url, region_name="us-east-1")  # the platform's one S3 client factory


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--server-side", action="store_true", help="also time a same-endpoint copy")
    args = parser.parse_args()
    (src_server, src_url), (dst_server, dst_url) = start_endpoint(), start_endpoint()
    try:
        src, dst = client(src_url), client(dst_url)
        src.create_bucket(Bucket="home")
        src.create_bucket(Bucket="region-same-endpoint")
        dst.create_bucket(Bucket="region")
        chunk = os.urandom(64 * MiB)
        data_sha = hashlib.sha256(chunk * (args.mib // 64)).hexdigest()
        key = blob_key(data_sha)
        size = 64 * MiB * (args.mib // 64)
        upload = src.create_multipart_upload(Bucket="home", Key=key)["UploadId"]
        parts = [
            {
                "PartNumber": n + 1,
                "ETag": src.upload_part(
                    Bucket="home", Key=key, UploadId=upload, PartNumber=n + 1, Body=chunk
                )["ETag"],
            }
            for n in range(args.mib // 64)
        ]
        src.complete_multipart_upload(
            Bucket="home", Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        source, destination = S3Store("home", src, src_url), S3Store("region", dst, dst_url)
        print(f"object: {size / MiB:.0f} MiB; endpoints {src_url} → {dst_url}")
        print(f"{'round':>5} {'side':<34} {'seconds':>8} {'MB/s':>8}")

        def baseline() -> float:
            dst.delete_object(Bucket="region", Key=key)
            start = time.perf_counter()
            dst.upload_fileobj(src.get_object(Bucket="home", Key=key)["Body"], "region", key)
            return time.perf_counter() - start

        class Hashing:  # what any verified copy must add: SHA-256 of the stream
            def __init__(self, body):  # type: ignore[no-untyped-def]
                self.body, self.digest = body, hashlib.sha256()

            def read(self, amount: int = -1) -> bytes:
                data = self.body.read(amount)
                self.digest.update(data)
                return bytes(data)

        def hashed() -> float:
            dst.delete_object(Bucket="region", Key=key)
            start = time.perf_counter()
            reader = Hashing(src.get_object(Bucket="home", Key=key)["Body"])
            dst.upload_fileobj(reader, "region", key)
            assert reader.digest.hexdigest() == data_sha
            return time.perf_counter() - start

        def ours() -> float:
            dst.delete_object(Bucket="region", Key=key)
            start = time.perf_counter()
            result = copy_blob(
                source,
                destination,
                data_sha,
                size,
                tuning=CopyTuning(part_size=args.part_mib * MiB, concurrency=args.concurrency),
                upload_id=None,
                remember_upload=lambda u: None,
                progress=lambda n: None,
            )
            assert result.verified and dst.head_object(Bucket="region", Key=key)["ContentLength"] == size
            return time.perf_counter() - start

        sides = {"base": baseline, "hashed": hashed, "ours": ours}
        labels = {
            "base": "boto3 defaults (stream upload)",
            "hashed": "boto3 defaults + SHA-256 of stream",
            "ours": "control plane copier",
        }
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(1, args.rounds + 1):
            # Rotate which side goes first, so none always gets the warmer servers.
            order = list(sides)[round_ % 3 :] + list(sides)[: round_ % 3]
            for side in order:
                took = sides[side]()
                times[side].append(took)
                print(f"{round_:>5} {labels[side]:<34} {took:>8.2f} {size / took / 1e6:>8.1f}")
            if not args.server_side:
                continue
            src.delete_object(Bucket="region-same-endpoint", Key=key)
            start = time.perf_counter()
            same_endpoint = S3Store("region-same-endpoint", src, src_url)
            copy_blob(
                source,
                same_endpoint,
                data_sha,
                size,
                tuning=CopyTuning(part_size=64 * MiB, concurrency=8),
                upload_id=None,
                remember_upload=lambda u: None,
                progress=lambda n: None,
            )
            same = time.perf_counter() - start
            label = "  same endpoint: server-side copy"
            speed = f"{size / same / 1e6:>8.1f}"
            print(f"{round_:>5} {label:<34} {same:>8.2f} {speed}")
        base = statistics.median(times["base"])
        print(f"median over {args.rounds} rounds:")
        for side, label in labels.items():
            took = statistics.median(times[side])
            print(f"  {label:<34} {size / took / 1e6:>7.1f} MB/s ({base / took:.2f}× boto3 defaults)")
    finally:
        for server in (src_server, dst_server):
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
