"""The response cache: the exact answer to a deterministic request, given again without an engine.

A tenant opts in per model (the control plane's ``response-cache`` setting puts ``cache`` on that route).
Then a request is looked up when it is deterministic, so its answer would be the same again: an embedding,
or a completion with ``temperature`` 0 or a fixed ``seed``. The key is the tenant, the served version's
artifact digest and the normalised request (path, and the JSON body with its keys sorted and whole
floats written as integers), so

- no tenant ever reads another's entry (the tenant is in the key and in the hash);
- a new version never answers with the old one's text (the digest is in the key), and entries of a
  version that leaves production are deleted (``purge``): the control plane lists only production
  versions' digests in the route, and every gateway deletes the entries of digests no route lists;
- entries live in the Redis store of the jurisdiction whose region served the answer
  (``GATEWAY_RESPONSE_CACHE_STORES``: ``EU=redis://…,US=redis://…``). The route names only places inside
  the tenant's residency, so a cached prompt and answer stay where the tenant's data may be; a
  jurisdiction without a store caches nothing.

Only whole answers are cached: a 200 whose stream reached ``[DONE]`` (never half a stream) and at most
``max_entry_bytes``. A hit is answered with ``x-cache: hit`` and metered as a request on the ``cache``
track: counted, no GPU cost attributed. Nothing semantic: two prompts that mean the same but differ in one
byte are two entries, because an answer given to a similar-looking conversation is a wrong answer in a
multi-turn one (docs/routing.md).

A store that is down or slow never fails a request: the lookup counts an error and the request goes to
an engine as if uncached.

Each store's commands from concurrent requests go together (``StorePipe``): every lookup waiting becomes
one ``MGET``, every answer to keep one pipeline, one exchange in flight at a time, so a busy gateway pays
a Redis round trip per batch, not per request (redis-py spends about 100 µs of CPU on each command).
"""

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway import contract

log = logging.getLogger("gateway")
PREFIX = "gwrc"
INDEX = f"{PREFIX}:index"  # "digest:tenant" of every entry written, so purge finds them without a full scan
WRITE_GATHER_SECONDS = 0.005  # answers to keep are gathered this long, then written in one exchange


def parse_stores(spec: str) -> dict[str, str]:
    """``EU=redis://…,US=redis://…`` → {jurisdiction: url}; '' → {} (no cache)."""
    stores = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        jurisdiction, sep, url = part.partition("=")
        if not sep or not jurisdiction.strip() or not url.strip():
            raise ValueError(f"GATEWAY_RESPONSE_CACHE_STORES: '{part}' is not JURISDICTION=redis://…")
        stores[jurisdiction.strip().upper()] = url.strip()
    return stores


def deterministic(path: str, payload: dict[str, Any]) -> bool:
    """The same request gets the same answer: an embedding, or sampling pinned by temperature 0 or a seed."""
    if path == "/v1/embeddings":
        return True
    temperature, seed = payload.get("temperature"), payload.get("seed")
    pinned = isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0
    return pinned or (isinstance(seed, int) and not isinstance(seed, bool))


def _normal(value: Any) -> Any:
    """JSON with one spelling per value: whole floats as integers (0.0 and 0 are one temperature)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def request_hash(tenant: str, path: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps(_normal(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256("\0".join((tenant, path, canonical)).encode()).hexdigest()


@dataclass(frozen=True)
class Lookup:
    """A cacheable request: its hash and the places its answer may be in, in the route's order."""

    tenant: str
    request: str
    places: tuple[tuple[str, str], ...]  # (jurisdiction, artifact digest), each with a store here
    ttl_seconds: int

    def key(self, digest: str) -> str:
        return f"{PREFIX}:{digest}:{self.tenant}:{self.request}"


@dataclass(frozen=True)
class Hit:
    body: bytes
    meta: dict[str, Any]  # content_type, usage and what served it first (region, deployment, version, …)


class StorePipe:
    """One store's lookups and writes from concurrent requests, sent together: whatever arrives while an
    exchange is in flight goes in the next one."""

    def __init__(self, name: str, client: Redis, counts: dict[str, int], max_queued: int = 10_000):
        self.name, self.client, self.counts, self.max_queued = name, client, counts, max_queued
        self.gets: list[tuple[str, asyncio.Future[bytes | None]]] = []
        self.puts: list[tuple[str, bytes, str, int]] = []  # key, value, index member, TTL
        self.getting = False  # a lookup exchange is in flight: new lookups queue for the next one
        self.getter: asyncio.Task[None] | None = None
        self.putter: asyncio.Task[None] | None = None
        self.failing = False

    async def get(self, key: str) -> bytes | None:
        """The value at ``key`` (None: none, or the store failed). With nothing in flight the lookup goes at
        once, in this request (no task to schedule: the common case stays one round trip); otherwise it
        waits for the next batch."""
        if self.getting:
            found: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            self.gets.append((key, found))
            return await found
        self.getting = True
        try:
            (value,) = await self._mget([key])
        finally:
            self._next_batch()
        return value

    def _next_batch(self) -> None:
        if self.gets:  # they queued behind this exchange: one exchange for all of them
            self.getter = asyncio.create_task(self._send_gets())
        else:
            self.getting = False

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        try:
            values = await self.client.mget(keys)
        except (RedisError, OSError) as exc:
            self._failed("lookup", exc, len(keys))
            return [None] * len(keys)
        self._ok()
        return [value if isinstance(value, bytes) else None for value in values]

    def put(self, key: str, value: bytes, member: str, ttl_seconds: int) -> None:
        if len(self.puts) >= self.max_queued:  # the store is far behind: an answer not kept costs nothing
            self.counts["dropped"] += 1
            return
        self.puts.append((key, value, member, ttl_seconds))
        if self.putter is None:
            self.putter = asyncio.create_task(self._send_puts())

    async def _send_gets(self) -> None:
        try:
            while self.gets:
                batch, self.gets = self.gets, []
                values = await self._mget([key for key, _ in batch])
                for (_, found), value in zip(batch, values, strict=True):
                    if not found.done():  # its request may be gone
                        found.set_result(value)
        finally:
            self.getter, self.getting = None, False

    async def _send_puts(self) -> None:
        try:
            while self.puts:
                # Nobody waits for a write: gathering a few ms of them makes one exchange of many.
                await asyncio.sleep(WRITE_GATHER_SECONDS)
                batch, self.puts = self.puts, []
                try:
                    async with self.client.pipeline(transaction=False) as pipe:
                        for key, value, _, ttl in batch:
                            pipe.set(key, value, ex=ttl)
                        pipe.sadd(INDEX, *{member for _, _, member, _ in batch})
                        await pipe.execute()
                    self.counts["stored"] += len(batch)
                    self._ok()
                except (RedisError, OSError) as exc:
                    self._failed("write", exc, len(batch))
        finally:
            self.putter = None

    def _failed(self, what: str, exc: BaseException, count: int) -> None:
        self.counts["errors"] += count
        if not self.failing:  # said once per outage, not once per batch
            log.warning("response cache %s: %s failed, serving uncached: %s", self.name, what, exc)
        self.failing = True

    def _ok(self) -> None:
        if self.failing:
            log.info("response cache %s: answering again", self.name)
        self.failing = False

    async def drain(self, timeout: float) -> None:
        for task in (self.getter, self.putter):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), timeout)


@dataclass
class ResponseCache:
    stores: dict[str, str] = field(default_factory=dict)  # jurisdiction → Redis URL
    max_entry_bytes: int = 2**20
    timeout_seconds: float = 0.1
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("hits", "misses", "stored", "too_large", "dropped", "errors", "purged"), 0
        )
    )

    def __post_init__(self) -> None:
        self.clients = {
            jurisdiction: Redis.from_url(
                url,
                socket_timeout=self.timeout_seconds,
                socket_connect_timeout=self.timeout_seconds,
                retry=Retry(NoBackoff(), 0),  # a slow store must not slow a request: it goes uncached
            )
            for jurisdiction, url in self.stores.items()
        }
        self.pipes = {name: StorePipe(name, client, self.counts) for name, client in self.clients.items()}

    def lookup(self, tenant: str, path: str, payload: dict[str, Any], route: contract.Route) -> Lookup | None:
        """The request's lookup, or None when it is not to be cached (not opted in, not deterministic, no
        store in any jurisdiction of the route's places)."""
        spec = route.get("cache")
        if not spec or not self.clients or not deterministic(path, payload):
            return None
        places = tuple(
            (p["jurisdiction"], p["artifact_sha256"])
            for p in spec["places"]
            if p["jurisdiction"] in self.clients
        )
        if not places:
            return None
        return Lookup(tenant, request_hash(tenant, path, payload), places, spec["ttl_seconds"])

    async def get(self, lookup: Lookup) -> Hit | None:
        """The first place (in the route's order) holding an answer; a store that fails counts as a miss."""
        if len(lookup.places) == 1:  # the usual route: one jurisdiction, one version
            (jurisdiction, digest), *_ = lookup.places
            found = [await self.pipes[jurisdiction].get(lookup.key(digest))]
        else:
            found = await asyncio.gather(
                *(self.pipes[jurisdiction].get(lookup.key(digest)) for jurisdiction, digest in lookup.places)
            )
        for value in found:
            hit = _decode(value) if value is not None else None
            if hit is not None:
                self.counts["hits"] += 1
                return hit
        self.counts["misses"] += 1
        return None

    def put(
        self,
        lookup: Lookup,
        endpoint: contract.Endpoint,
        kept: list[bytes] | None,
        meta: dict[str, Any],
        stream: bool,
    ) -> None:
        """Keep a whole answer from ``endpoint`` (``kept``: its bytes, None when they passed the size limit)
        in its jurisdiction's store, if that is one of the lookup's places (a production version, inside
        residency); queued for the store's next write, never awaited."""
        place = (endpoint.get("jurisdiction", ""), endpoint["artifact_sha256"])
        if place not in lookup.places or endpoint.get("track", contract.STABLE) != contract.STABLE:
            return
        if kept is None:
            self.counts["too_large"] += 1
            return
        body = whole(kept, stream)
        if body is None:
            return
        value = json.dumps(meta, separators=(",", ":")).encode() + b"\n" + body
        jurisdiction, digest = place
        self.pipes[jurisdiction].put(
            lookup.key(digest), value, f"{digest}:{lookup.tenant}", lookup.ttl_seconds
        )

    async def purge(self, live: set[str]) -> int:
        """Delete every entry whose "digest:tenant" no route lists any more (a version left production, a
        tenant opted out); every store, every gateway may run it at once. The number of entries deleted."""
        deleted = 0
        for jurisdiction, client in self.clients.items():
            try:
                deleted += await self._purge(client, live)
            except (RedisError, OSError) as exc:
                self.counts["errors"] += 1
                log.warning(
                    "response cache %s: purge failed (tried again with the next table): %s", jurisdiction, exc
                )
        self.counts["purged"] += deleted
        return deleted

    async def _purge(self, client: Redis, live: set[str]) -> int:
        deleted = 0
        for member in {
            m.decode() if isinstance(m, bytes) else m for m in await client.smembers(INDEX)
        } - live:
            async for batch in _batches(client.scan_iter(match=f"{PREFIX}:{member}:*", count=1000)):
                deleted += await client.unlink(*batch)
            await client.srem(INDEX, member)
        return deleted

    async def follow(self, tables: Any) -> None:
        """Purge once now and after every new route table (``tables``: the gateway's RouteCache)."""
        while True:
            changed = tables.changed()
            if tables.body:
                await self.purge(live_places(tables.body))
            await changed.wait()

    def stats(self) -> dict[str, int]:
        return {"stores": len(self.clients), **self.counts}

    async def close(self) -> None:
        for pipe in self.pipes.values():
            await pipe.drain(timeout=1)  # the answers still queued are written
        for client in self.clients.values():
            await client.aclose()


META_KEYS = frozenset({"content_type", "usage", "region", "deployment", "version", "artifact_sha256"})


def _decode(value: bytes) -> Hit | None:
    """An entry as ``put`` wrote it; anything else in the store (written by another client) is a miss."""
    header, _, body = value.partition(b"\n")
    try:
        meta = json.loads(header)
    except ValueError:
        return None
    if (
        not isinstance(meta, dict)
        or not meta.keys() >= META_KEYS
        or not isinstance(meta["content_type"], str)
    ):
        return None
    return Hit(body, meta)


def live_places(table: contract.RouteTable) -> set[str]:
    """ "digest:tenant" of every route that may be cached now: what purge keeps."""
    return {
        f"{place['artifact_sha256']}:{tenant}"
        for tenant, routes in table.get("tenants", {}).items()
        for route in routes["models"].values()
        for place in route.get("cache", {}).get("places", [])
    }


async def _batches(keys: Any, size: int = 500) -> Any:
    batch: list[bytes] = []
    async for key in keys:
        batch.append(key)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def cached_endpoint(meta: dict[str, Any]) -> contract.Endpoint:
    """The endpoint a hit's usage record names: what served the answer first, at the URL ``cache``."""
    return {
        "url": "cache",
        "region": meta["region"],
        "priority": 0,
        "weight": 1,
        "deployment": meta["deployment"],
        "version": meta["version"],
        "served_model": meta.get("served_model", ""),
        "artifact_sha256": meta["artifact_sha256"],
        "shared": False,
        "track": contract.CACHED,
    }


def entry_meta(endpoint: contract.Endpoint, content_type: str, usage: Any) -> dict[str, Any]:
    return {
        "content_type": content_type,
        "usage": usage if isinstance(usage, dict) else {},
        "region": endpoint["region"],
        "deployment": endpoint["deployment"],
        "version": endpoint["version"],
        "served_model": endpoint["served_model"],
        "artifact_sha256": endpoint["artifact_sha256"],
    }


def whole(body: Iterable[bytes], stream: bool) -> bytes | None:
    """The answer to keep: all of it, and for a stream only one that reached ``[DONE]``."""
    data = b"".join(body)
    if stream and not data.rstrip().endswith(b"data: [DONE]"):
        return None
    return data
