"""The route table as the gateway holds it: fetched by long-poll with ETags, kept on disk."""

import asyncio
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gateway import contract
from gateway.topology import parse_entry_regions, parse_regions, regional

log = logging.getLogger("gateway")


@dataclass
class Settings:
    control_plane: str
    token: str
    cache_file: Path | None
    long_poll_seconds: int = 25
    upstream_timeout_seconds: float = 600.0  # long generations: minutes, not Envoy's 15 s default
    connect_timeout_seconds: float = 2.0
    upstream_keepalive_seconds: float = 4.0  # below the engines' own idle timeout (vLLM's is 5 s)
    max_attempts: int = 3
    ejection_seconds: float = 30.0  # an endpoint's circuit opens for this × times opened in a row
    max_ejection_seconds: float = 300.0
    retry_budget_ratio: float = 0.2  # retries in flight at most this share of the requests in flight
    retry_budget_floor: int = 3  # ... or this many, whichever is more
    max_in_flight_per_endpoint: int = (
        0  # this process's requests at one engine that make it saturated; 0: off
    )
    shed_retry_after_seconds: int = 2  # Retry-After of a request shed while its model is saturated
    prefix_routing: bool = True  # prefer the engine that last served the prompt's longest prefix
    prefix_imbalance: int = 4  # ... unless it has this many more requests in flight than the least busy
    prefix_index_entries: int = 100_000  # prefix hashes remembered (about 5 MB)
    max_body_bytes: int = 10 * 2**20  # a request body past this is refused (413) while it is read
    max_json_depth: int = 64  # arrays and objects nested deeper are refused (400)
    max_header_bytes: int = 64 * 2**10  # all request headers together; more is refused (431)
    state_dir: Path | None = None  # the usage spool; the cache file's directory, else ./var/gateway
    usage_interval_seconds: float = 1.0
    max_mirrors_in_flight: int = 32  # shadow copies running at once; past it a copy is dropped (counted)
    mirror_timeout_seconds: float = 30.0  # a shadow copy's whole exchange, far below a client's 600 s
    hold_max_requests: int = 100  # requests held per (tenant, model) while its deployment wakes from zero
    hold_timeout_seconds: float = 600.0  # a held request still waiting after this gets 504
    metrics_token: str = ""  # a scraper must send it to read /metrics; '' allows this host only
    redis_url: str = ""  # limits shared by every gateway process (gateway/fleet_limits.py); '' per process
    limit_lease_seconds: float = 60.0  # a place in flight a dead gateway held is free after this
    redis_retry_seconds: float = 5.0  # after Redis failed, limits are per process this long
    # The response cache's Redis per jurisdiction, "EU=redis://…,US=redis://…" (gateway/response_cache.py);
    # '' caches nothing. Cached prompts and answers live in the store of the jurisdiction that served them.
    response_cache_stores: str = ""
    response_cache_max_bytes: int = 2**20  # a larger answer is not cached
    # A regional gateway serves only these regions' engines (gateway/topology.py); empty: every region.
    regions: frozenset[str] = frozenset()
    # Networks of the gateway's own side that pipelines' http stages may call anyway (tenants' services on
    # a private network), "10.20.0.0/16,127.0.0.1/32"; by default none: loopback, private, link-local.
    stage_networks: tuple[str, ...] = ()
    # A global entry's regional gateways, region code → URL (``python -m gateway --entry``).
    entry_regions: dict[str, str] = field(default_factory=dict)

    def usage_dir(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        return self.cache_file.parent if self.cache_file else Path("var") / "gateway"

    def regions_query(self) -> str:
        """``&regions=a,b`` naming the regions it serves, for the control plane's residency checks."""
        return f"&regions={','.join(sorted(self.regions))}" if self.regions else ""

    @classmethod
    def from_env(cls) -> "Settings":
        token = os.environ.get("GATEWAY_TOKEN", "")
        token_file = os.environ.get("GATEWAY_TOKEN_FILE", "")
        if not token and token_file and Path(token_file).exists():
            token = Path(token_file).read_text().strip()
        cache = os.environ.get("GATEWAY_CACHE_FILE", "")
        return cls(
            control_plane=os.environ.get("CONTROL_PLANE_URL", "http://127.0.0.1:8000").rstrip("/"),
            token=token,
            cache_file=Path(cache) if cache else None,
            upstream_timeout_seconds=float(os.environ.get("GATEWAY_UPSTREAM_TIMEOUT", "600")),
            connect_timeout_seconds=float(os.environ.get("GATEWAY_CONNECT_TIMEOUT", "2")),
            ejection_seconds=float(os.environ.get("GATEWAY_EJECTION_SECONDS", "30")),
            max_ejection_seconds=float(os.environ.get("GATEWAY_MAX_EJECTION_SECONDS", "300")),
            retry_budget_ratio=float(os.environ.get("GATEWAY_RETRY_BUDGET_RATIO", "0.2")),
            retry_budget_floor=int(os.environ.get("GATEWAY_RETRY_BUDGET_FLOOR", "3")),
            max_in_flight_per_endpoint=int(os.environ.get("GATEWAY_MAX_IN_FLIGHT_PER_ENDPOINT", "0")),
            shed_retry_after_seconds=int(os.environ.get("GATEWAY_SHED_RETRY_AFTER_SECONDS", "2")),
            prefix_routing=os.environ.get("GATEWAY_PREFIX_ROUTING", "1") != "0",
            prefix_imbalance=int(os.environ.get("GATEWAY_PREFIX_IMBALANCE", "4")),
            prefix_index_entries=int(os.environ.get("GATEWAY_PREFIX_INDEX_ENTRIES", "100000")),
            upstream_keepalive_seconds=float(os.environ.get("GATEWAY_UPSTREAM_KEEPALIVE_SECONDS", "4")),
            long_poll_seconds=int(os.environ.get("GATEWAY_LONG_POLL_SECONDS", "25")),
            max_body_bytes=int(os.environ.get("GATEWAY_MAX_BODY_BYTES", str(10 * 2**20))),
            max_json_depth=int(os.environ.get("GATEWAY_MAX_JSON_DEPTH", "64")),
            max_header_bytes=int(os.environ.get("GATEWAY_MAX_HEADER_BYTES", str(64 * 2**10))),
            state_dir=Path(os.environ["GATEWAY_STATE_DIR"]) if os.environ.get("GATEWAY_STATE_DIR") else None,
            usage_interval_seconds=float(os.environ.get("GATEWAY_USAGE_INTERVAL_SECONDS", "1")),
            max_mirrors_in_flight=int(os.environ.get("GATEWAY_MAX_MIRRORS_IN_FLIGHT", "32")),
            mirror_timeout_seconds=float(os.environ.get("GATEWAY_MIRROR_TIMEOUT", "30")),
            hold_max_requests=int(os.environ.get("GATEWAY_HOLD_MAX_REQUESTS", "100")),
            hold_timeout_seconds=float(os.environ.get("GATEWAY_HOLD_TIMEOUT_SECONDS", "600")),
            redis_url=os.environ.get("GATEWAY_REDIS_URL", ""),
            metrics_token=os.environ.get("GATEWAY_METRICS_TOKEN", ""),
            limit_lease_seconds=float(os.environ.get("GATEWAY_LIMIT_LEASE_SECONDS", "60")),
            redis_retry_seconds=float(os.environ.get("GATEWAY_REDIS_RETRY_SECONDS", "5")),
            response_cache_stores=os.environ.get("GATEWAY_RESPONSE_CACHE_STORES", ""),
            response_cache_max_bytes=int(os.environ.get("GATEWAY_RESPONSE_CACHE_MAX_BYTES", str(2**20))),
            regions=parse_regions(os.environ.get("GATEWAY_REGIONS", "")),
            entry_regions=parse_entry_regions(os.environ.get("GATEWAY_ENTRY_REGIONS", "")),
            stage_networks=tuple(n for n in os.environ.get("GATEWAY_STAGE_NETWORKS", "").split(",") if n),
        )


@dataclass
class RouteCache:
    settings: Settings
    body: contract.RouteTable = field(default_factory=contract.RouteTable)  # empty: no table yet
    etag: str = ""
    generation: int = 0
    fetched_at: float = 0.0
    wants_secrets: bool = True  # the global entry runs no pipeline: it asks for no tenant's secret
    # Set when a new table is installed, then replaced by a fresh one: requests held for a deployment at
    # zero (gateway/hold.py) wait on it for the table that gives their route endpoints.
    _changed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def load_from_disk(self) -> None:
        path = self.settings.cache_file
        if path and path.exists():
            saved = json.loads(path.read_text())
            self.install(saved["body"], saved["etag"], saved["generation"])
            log.info("route table #%s loaded from %s", self.generation, path)

    def install(self, body: contract.RouteTable, etag: str, generation: int) -> None:
        """Make this table the one requests are routed by, and wake whoever waits for a new one."""
        self.body, self.etag, self.generation = regional(body, self.settings.regions), etag, generation
        self._changed.set()
        self._changed = asyncio.Event()

    def changed(self) -> asyncio.Event:
        """Set once a table newer than the one installed now arrives: take it before reading the table."""
        return self._changed

    def _save(self) -> None:
        path = self.settings.cache_file
        if path:
            # A file of this process's own (workers write side by side), readable by the gateway's user
            # only (mkstemp: 0600): the table carries engine keys and tenants' secrets.
            handle, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
            with os.fdopen(handle, "w") as out:
                json.dump({"body": self.body, "etag": self.etag, "generation": self.generation}, out)
            os.replace(partial, path)  # atomic: a crash never leaves half a table

    def tenant_of(self, digest: str, requested: str | None) -> str | None:
        credential = self.body.get("credentials", {}).get(digest)
        expires = credential.get("expires") if credential else None
        if not credential or (expires and expires < time.time()):
            return None
        tenants = credential["tenants"]  # the control plane binds every token to exactly one tenant
        if len(tenants) != 1:
            return None
        return tenants[0] if requested in (None, "", tenants[0]) else None

    def priority_of(self, digest: str) -> str | None:
        credential = self.body.get("credentials", {}).get(digest)
        return credential.get("priority") if credential else None

    def view(self, tenant: str) -> contract.TenantRoutes:
        return self.body.get("tenants", {}).get(tenant, {"limits": {}, "blocked": "", "models": {}})

    async def fetch(self, session: aiohttp.ClientSession, wait: int) -> bool:
        """One conditional (long-poll) request; True when a new table arrived."""
        headers = {"Authorization": f"Bearer {self.settings.token}"}
        if self.etag:
            headers["If-None-Match"] = f'"{self.etag}"'
        url = f"{self.settings.control_plane}/api/v1/routing/gateway-config/?wait={wait}"
        url += self.settings.regions_query()  # tenants' secrets come only to where their data may be
        url += "" if self.wants_secrets else "&secrets=none"
        timeout = aiohttp.ClientTimeout(total=wait + 10)
        async with session.get(url, headers=headers, timeout=timeout) as reply:
            if reply.status == 304:
                self.fetched_at = time.time()
                return False
            reply.raise_for_status()
            data: contract.GatewayConfig = await reply.json()
        self.install(data["table"], data["etag"], data["generation"])
        self.fetched_at = time.time()
        self._save()
        log.info("route table #%s", self.generation)
        return True

    async def follow(self, session: aiohttp.ClientSession) -> None:
        """Keep the table fresh; on errors keep the last one and retry (the control plane may be down)."""
        wait = 0  # the first fetch answers at once
        while True:
            try:
                await self.fetch(session, wait)
                wait = self.settings.long_poll_seconds
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: keep serving from the last table
                log.warning("route table fetch failed (serving generation %s): %s", self.generation, exc)
                await asyncio.sleep(1.0)
