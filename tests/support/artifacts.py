"""Blobs put straight into a store, as an earlier ingest or copy would have left them."""

import hashlib

from artifacts.drivers.stores import ObjectStore, blob_key


def put_blob(store: ObjectStore, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    upload = store.begin(blob_key(sha))
    store.complete(blob_key(sha), upload, {1: store.put_part(blob_key(sha), upload, 1, data)}, sha)
    return sha


def region_with_store(make_region, code, jurisdiction, store):  # type: ignore[no-untyped-def]
    region = make_region(code, jurisdiction)
    region.object_store = store
    region.save()
    return region
