"""The response cache: the exact answer to a deterministic request, given again without an engine.

A tenant opts in per model (the control plane's ``response-cache`` setting puts ``cache`` on that route).
Then a request is looked up when it is deterministic, so its answer would be the same again: an embedding,
or a completion with ``temperature`` 0 or a fixed ``seed``. The key is the jurisdiction, the release that
answered (deployment, version and artifact digest: weights, runtime, template and engine arguments are
all the version's), the tenant and the normalised request (path, and the JSON body with its keys sorted
and whole floats written as integers), so

- no tenant ever reads another's entry (the tenant is in the key and in the hash);
- a new version never answers with an old one's text, even with the same weights (the release is in
  the key), and entries of a release that leaves production are deleted (``purge``): the control plane
  lists only production releases in the route, and every gateway deletes the entries of members
  (jurisdiction, release, tenant) no route lists, store by store;
- entries live in the Redis store of the jurisdiction whose region served the answer
  (``GATEWAY_RESPONSE_CACHE_STORES``: ``EU=redis://…,US=redis://…``). The route names only places inside
  the tenant's residency, an answer is kept only if the table in force when it arrives still names its
  place, and a place the table stops naming (residency narrowed) is purged from its store: cached prompts
  and answers stay where the tenant's data may be. A jurisdiction without a store caches nothing.

Only whole, good answers are cached: a 200 with choices (or embeddings) and no error, and for a stream one
that reached ``[DONE]`` with no error event (vLLM reports an engine failure mid-stream as an event), at
most ``max_entry_bytes``. A hit is answered with ``x-cache: hit`` and metered as a request on the
``cache`` track: counted, no GPU cost attributed. Nothing semantic: two prompts that mean the same but
differ in one byte are two entries, because an answer given to a similar-looking conversation is a wrong
answer in a multi-turn one (docs/routing.md). How each store is used (batched, indexed, never in the
way): ``gateway/cache_store.py``.
"""

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway import contract
from gateway.cache_store import PREFIX, StorePipe

log = logging.getLogger("gateway")


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
    # ASCII escapes: a lone surrogate a client may send is hashed, never an encoding error.
    canonical = json.dumps(_normal(payload), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256("\0".join((tenant, path, canonical)).encode()).hexdigest()


def release_of(deployment: int, version: str, artifact_sha256: str) -> str:
    """What answered, as one short name: the deployment, its version and the weights' digest."""
    return hashlib.sha256(f"{deployment}\0{version}\0{artifact_sha256}".encode()).hexdigest()[:32]


def _place(place: contract.CachePlace) -> tuple[str, str]:
    return place["jurisdiction"], release_of(place["deployment"], place["version"], place["artifact_sha256"])


@dataclass(frozen=True)
class Lookup:
    """A cacheable request: its hash and the places its answer may be in, in the route's order."""

    tenant: str
    request: str
    places: tuple[tuple[str, str], ...]  # (jurisdiction, release), each with a store here
    ttl_seconds: int

    def member(self, jurisdiction: str, release: str) -> str:
        return f"{jurisdiction}:{release}:{self.tenant}"

    def key(self, jurisdiction: str, release: str) -> str:
        return f"{PREFIX}:{self.member(jurisdiction, release)}:{self.request}"


@dataclass(frozen=True)
class Hit:
    body: bytes
    meta: dict[str, Any]  # content_type, usage and what served it first (region, deployment, version, …)


@dataclass
class ResponseCache:
    stores: dict[str, str] = field(default_factory=dict)  # jurisdiction → Redis URL
    max_entry_bytes: int = 2**20
    timeout_seconds: float = 0.1
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("hits", "misses", "stored", "too_large", "not_kept", "dropped", "bypassed", "errors", "purged"),
            0,
        )
    )
    live: dict[str, set[str]] | None = None  # per jurisdiction, the members the table in force names

    def __post_init__(self) -> None:
        self.pipes = {
            jurisdiction: StorePipe(
                jurisdiction,
                Redis.from_url(
                    url,
                    socket_timeout=self.timeout_seconds,
                    socket_connect_timeout=self.timeout_seconds,
                    retry=Retry(NoBackoff(), 0),  # a slow store must not slow a request: it goes uncached
                ),
                self.counts,
            )
            for jurisdiction, url in self.stores.items()
        }

    def lookup(self, tenant: str, path: str, payload: dict[str, Any], route: contract.Route) -> Lookup | None:
        """The request's lookup, or None when it is not to be cached (not opted in, not deterministic, no
        store in any jurisdiction of the route's places)."""
        spec = route.get("cache")
        if not spec or not self.pipes or not deterministic(path, payload):
            return None
        try:
            places = tuple(_place(p) for p in spec["places"] if p["jurisdiction"] in self.pipes)
        except (KeyError, TypeError):  # a table this gateway does not understand: serve uncached
            self.counts["errors"] += 1
            return None
        if not places:
            return None
        return Lookup(tenant, request_hash(tenant, path, payload), places, spec["ttl_seconds"])

    async def get(self, lookup: Lookup) -> Hit | None:
        """The first place (in the route's order) holding an answer; a store that fails counts as a miss."""
        if len(lookup.places) == 1:  # the usual route: one jurisdiction, one release
            (jurisdiction, release), *_ = lookup.places
            found = [await self.pipes[jurisdiction].get(lookup.key(jurisdiction, release))]
        else:
            found = await asyncio.gather(*(self.pipes[j].get(lookup.key(j, r)) for j, r in lookup.places))
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
        """Keep a whole, good answer from ``endpoint`` (``kept``: its bytes, None when they passed the size
        limit) in its jurisdiction's store, if the table in force still names that place for the tenant (a
        production release, inside residency); queued for the store's next write, never awaited, never
        raising."""
        try:
            jurisdiction = endpoint.get("jurisdiction", "")
            release = release_of(endpoint["deployment"], endpoint["version"], endpoint["artifact_sha256"])
            member = lookup.member(jurisdiction, release)
            if (jurisdiction, release) not in lookup.places or endpoint.get(
                "track", contract.STABLE
            ) != contract.STABLE:
                return
            if self.live is None or member not in self.live.get(jurisdiction, set()):
                self.counts["not_kept"] += 1  # the table moved on while it was served (opted out, residency)
                return
            if kept is None:
                self.counts["too_large"] += 1
                return
            body = good_answer(kept, stream)
            if body is None:
                self.counts["not_kept"] += 1
                return
            value = json.dumps(meta, separators=(",", ":")).encode() + b"\n" + body
            self.pipes[jurisdiction].put(lookup.key(jurisdiction, release), value, member, lookup.ttl_seconds)
        except Exception:  # a cache must never fail a request that was answered
            log.exception("response cache: could not keep an answer")

    def install(self, table: contract.RouteTable) -> None:
        """The table in force: what may be kept from now on."""
        live: dict[str, set[str]] = {jurisdiction: set() for jurisdiction in self.pipes}
        for tenant, routes in table.get("tenants", {}).items():
            for route in routes["models"].values():
                for place in route.get("cache", {}).get("places", []):
                    jurisdiction, release = _place(place)
                    if jurisdiction in live:
                        live[jurisdiction].add(f"{jurisdiction}:{release}:{tenant}")
        self.live = live

    async def purge(self) -> int:
        """Delete, store by store, every entry of a member the table in force does not name (a release left
        production, a tenant opted out, residency narrowed); every gateway may run it at once."""
        deleted = 0
        for jurisdiction, pipe in self.pipes.items():
            try:
                mine = {m for m in await pipe.members() if m.startswith(f"{jurisdiction}:")}
                deleted += await pipe.purge(mine - (self.live or {}).get(jurisdiction, set()))
            except Exception as exc:
                self.counts["errors"] += 1
                log.warning("response cache %s: purge failed: %s", jurisdiction, exc)
        self.counts["purged"] += deleted
        return deleted

    async def follow(self, tables: Any) -> None:
        """Install every new route table and purge what it no longer names (``tables``: the RouteCache)."""
        while True:
            changed = tables.changed()
            try:
                if tables.body:
                    self.install(tables.body)
                    await self.purge()
            except Exception:  # a table this gateway cannot read for the cache: keep following
                log.exception("response cache: could not take route table #%s", tables.generation)
            await changed.wait()

    def stats(self) -> dict[str, int]:
        return {"stores": len(self.pipes), **self.counts}

    async def close(self) -> None:
        for pipe in self.pipes.values():
            await pipe.drain(timeout=1)  # the answers still queued are written
            await pipe.client.aclose()


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


def good_answer(body: list[bytes], stream: bool) -> bytes | None:
    """The answer to keep, or None: a stream must reach ``[DONE]`` and carry no error event, a whole answer
    must be an object with choices (or embeddings' data) and no error."""
    data = b"".join(body)
    if not stream:
        return data if _good(_json(data)) else None
    events = [line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:")]
    if not events or events[-1] != b"[DONE]":
        return None
    parsed = [_json(event) for event in events[:-1]]
    return data if parsed and all(isinstance(e, dict) and "error" not in e for e in parsed) else None


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _good(answer: Any) -> bool:
    return (
        isinstance(answer, dict)
        and "error" not in answer
        and bool(answer.get("choices") or answer.get("data"))
    )


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
