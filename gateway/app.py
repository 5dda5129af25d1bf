"""The ASGI application: OpenAI-compatible endpoints, authenticated, routed, metered, streamed."""

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gateway import contract
from gateway.admission import request_priority
from gateway.asgi import App, caller
from gateway.balancer import engine_headers, mirror_target, track_of
from gateway.breakers import RetryBudget, broken_connection
from gateway.config import RouteCache, Settings
from gateway.decisions import Decisions
from gateway.fleet_limits import FleetLimits
from gateway.hold import ClientGone, Held, HoldRefused, Holds
from gateway.inbound import (
    POOLING,
    Refused,
    bearer_digest,
    client_request_id,
    parse_payload,
    preview_track,
    read_body,
    session_key,
)
from gateway.limits import over_budget, rate_limited
from gateway.metering import Outcome, spent_tokens, usage_record
from gateway.metrics import GatewayMetrics, exposition, may_scrape
from gateway.mirror import MirrorCopy, Mirrors
from gateway.pipeline_requests import PipelineRequests
from gateway.prefix import prompt_blocks
from gateway.reply import Reply
from gateway.response_cache import Hit, Lookup, ResponseCache, cached_endpoint, entry_meta, parse_stores
from gateway.retrieval import Indexes
from gateway.stage_network import StageNetwork
from gateway.streaming import EventFilter
from gateway.tracing import Tracing, trace_id, upstream_headers
from gateway.tracing import finish as finish_span
from gateway.usage import UsageShipper

log = logging.getLogger("gateway")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "server",
    "date",
}


class Upstream5xx(Exception):
    pass


class Gateway(App):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.routes = RouteCache(settings)
        self.limits = FleetLimits(
            settings.redis_url,
            lease_seconds=settings.limit_lease_seconds,
            retry_seconds=settings.redis_retry_seconds,
        )
        self.retries = RetryBudget(settings.retry_budget_ratio, settings.retry_budget_floor)
        self.usage = UsageShipper(settings)
        self.metrics = GatewayMetrics()
        self.decide = Decisions(settings, self.metrics)
        self.breakers, self.admission = self.decide.breakers, self.decide.admission
        self.prefixes = self.decide.prefixes
        self.tracing = Tracing()
        self.cache = ResponseCache(
            parse_stores(settings.response_cache_stores), settings.response_cache_max_bytes
        )
        self.mirrors = Mirrors(settings, self.usage)
        self.holds = Holds(settings, self.routes)
        self.indexes = Indexes(settings)
        self.stage_network = StageNetwork(list(settings.stage_networks))
        self.pipelines = PipelineRequests(
            self.handle,
            self.routes,
            self.limits,
            self.metrics,
            self.tracing,
            self.indexes,
            self.stage_network,
        )
        # Candidate attempts that failed before the first byte and were retried on the stable revision: the
        # client's record names only the endpoint that answered, so this is where such failures show.
        self.candidate_failures = 0
        self.fallback_salt_key = secrets.token_bytes(32)  # for a table without salts (an older control plane)
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.routes.load_from_disk()
        self.usage.open()
        self.session = aiohttp.ClientSession(
            # Idle upstream connections are closed before the engine closes them (vLLM: after 5 s), so a
            # request rarely takes one the engine is closing at that moment.
            connector=aiohttp.TCPConnector(
                limit=0, keepalive_timeout=self.settings.upstream_keepalive_seconds
            ),
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=self.settings.connect_timeout_seconds,
                sock_read=self.settings.upstream_timeout_seconds,
            ),
            auto_decompress=False,
        )
        self.tasks = [
            asyncio.create_task(self.routes.follow(self.session)),
            asyncio.create_task(self.usage.ship_forever(self.session)),
            asyncio.create_task(self.limits.renew_forever()),
            asyncio.create_task(self.cache.follow(self.routes)),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await self.holds.stop()
        if self.session is not None:
            await self.mirrors.drain(timeout=1)  # their records go out with the last batch below
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.usage.ship_once(self.session), timeout=5)
            self.usage.close()
            await self.session.close()
        await self.stage_network.close()
        await self.limits.close()
        await self.cache.close()
        self.tracing.shutdown()  # the spans still batched go out

    # --- requests --------------------------------------------------------------------------------------
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # Our own id for every request: usage is keyed by it, so no header can merge or hide requests.
        reply = Reply(send, uuid.uuid4().hex)
        reply.pipeline = scope.get("pipeline")  # set only by _stage_request, on a scope of its own
        path, method = scope["path"], scope["method"]
        if sum(len(k) + len(v) for k, v in scope["headers"]) > self.settings.max_header_bytes:
            return await reply.error(431, "The request headers are too large.", "headers_too_large")
        if path == "/healthz":
            health = {
                "status": "ok",
                "generation": self.routes.generation,
                "usage": self.usage.stats(),
                "mirrors": self.mirrors.stats(),
                "holds": self.holds.stats(),
                "limits": self.limits.stats(),
                "response_cache": self.cache.stats(),
            }
            return await reply.json(200, health)
        if path == "/readyz":  # ready once it has a route table to serve by (fetched, or from its cache file)
            ready = bool(self.routes.body)
            return await reply.json(
                200 if ready else 503, {"ready": ready, "generation": self.routes.generation}
            )
        if path == "/metrics":
            if not may_scrape(self.settings.metrics_token, scope, headers):
                return await reply.error(
                    403,
                    "Metrics name tenants: scrape from this host or with GATEWAY_METRICS_TOKEN.",
                    "forbidden",
                )
            return await reply.text(200, self._metrics_text())
        called = await caller(reply, self.routes, path, method, headers)
        if called is None:
            return
        tenant, digest = called
        view = self.routes.view(tenant)
        try:
            body = await read_body(receive, headers, self.settings.max_body_bytes)
            payload = parse_payload(body, self.settings.max_json_depth)
            preview = preview_track(headers)
            priority = request_priority(headers, self.routes.priority_of(digest))
        except Refused as bad:
            return await reply.error(bad.status, bad.message, bad.code)
        name = payload["model"]
        route = view["models"].get(name)
        pipeline = view.get("pipelines", {}).get(name) if route is None else None
        if pipeline is not None:
            if path != "/v1/chat/completions":
                message = f"{name} is a pipeline: it answers /v1/chat/completions only."
                return await reply.error(400, message, "invalid_request")
            assert self.session is not None
            return await self.pipelines.serve(
                self.session, scope, send, reply, tenant, name, pipeline, payload, headers
            )
        if route is None:
            return await reply.error(
                404, f"The model '{name}' does not exist for this tenant.", "model_not_found"
            )
        route = self.decide.degrade(reply, tenant, view, name, route, preview)
        # A preview asks for a revision by name: the cache (the stable revision's answers) is not it.
        lookup = None if preview else self.cache.lookup(tenant, path, payload, route)
        hit = await self.cache.get(lookup) if lookup and not view.get("blocked") else None
        refusal = None if hit else self.decide.refusal(tenant, view, name, route, priority, preview)
        if refusal is not None:
            status, message, code, extra = refusal
            return await reply.error(status, message, code, extra)
        refused, ticket = await self.limits.admit(tenant, view.get("limits", {}), reply.request_id)
        if refused:
            self.metrics.refuse(tenant, "rate_limit")
            return await reply.error(*rate_limited(tenant, refused))
        seen = Outcome()
        try:
            if hit is not None:  # no engine runs: nothing is held, shed or counted as tokens
                return await self._answer_cached(reply, tenant, name, path, headers, priority, hit, seen)
            held = None
            if not route["endpoints"]:  # at zero: wait for it to wake (gateway/hold.py)
                held = await self._hold(reply, tenant, name, headers, receive)
                if held is None:
                    return
                route, view = held.route, self.routes.view(tenant)
            await self._proxy(
                reply, tenant, name, route, path, payload, headers, preview, priority, seen, held, lookup
            )
        finally:
            # Its place in the tenant's requests in flight is free, its tokens count against the minute.
            await self.limits.finish(ticket, 0 if hit else spent_tokens(seen))

    async def _hold(
        self, reply: Reply, tenant: str, name: str, headers: dict[str, str], receive: Any
    ) -> Held | None:
        """Hold the request until its route has endpoints; None when it was answered instead (queue full,
        timeout, refused by the newer table) or its client went away (nothing to answer, nothing metered)."""
        assert self.session is not None
        try:
            held = await self.holds.hold(self.session, tenant, name, receive)
        except HoldRefused as refused:
            await reply.error(refused.status, refused.message, refused.code, refused.headers)
            return None
        except ClientGone:
            return None
        reply.held_ms = held.waited_ms
        # Released by a newer table, so judged by it again: a token revoked or a budget spent meanwhile.
        if self._authenticate(headers) != tenant:
            await reply.error(401, "The API token was revoked while the request was held.", "invalid_api_key")
            return None
        blocked = self.routes.view(tenant).get("blocked")
        if blocked:
            await reply.error(*over_budget(tenant, blocked))
            return None
        return held

    def _authenticate(self, headers: dict[str, str]) -> str | None:
        digest = bearer_digest(headers)
        return self.routes.tenant_of(digest, headers.get("openai-organization")) if digest else None

    async def _proxy(
        self,
        reply: Reply,
        tenant: str,
        name: str,
        route: contract.Route,
        path: str,
        payload: dict[str, Any],
        headers: dict[str, str],
        preview: str | None,
        priority: str,
        seen: Outcome,
        held: Held | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        assert self.session is not None
        stream = bool(payload.get("stream"))
        if lookup is not None:  # keep the answer for the cache, as the client gets it
            reply.cache, seen.kept, seen.keep_limit = "miss", [], self.cache.max_entry_bytes
        asked_for_usage = payload.get("stream_options", {}).get("include_usage") is True
        if stream and path not in POOLING:
            # So the last event counts tokens; that usage-only event reaches the client only if it asked.
            payload.setdefault("stream_options", {})["include_usage"] = True
        affinity = session_key(headers, payload)
        client_salt = payload.get("cache_salt")
        # A held request's latency is the client's: from the start of its hold, not from its release.
        started, wall = (held.since, held.wall) if held else (time.perf_counter(), datetime.now(UTC))
        about = {
            "gateway.tenant": tenant,
            "gateway.priority": priority,
            "gateway.request_id": reply.request_id,
        }
        if reply.pipeline is not None:  # a pipeline's stage: its span is the stage's child
            about["gateway.pipeline"], about["gateway.pipeline.stage"] = reply.pipeline
        span = self.tracing.start(headers, path, name, about)
        reply.trace_headers, reply.trace_id = upstream_headers(span), trace_id(span)
        tried = set[str]()
        last_error, reconnected = "", False
        hashes = (
            prompt_blocks(tenant, payload) if self.settings.prefix_routing and path not in POOLING else []
        )
        # Whatever happens from here on (an engine failing mid-stream, the client gone, a bug), the
        # request is metered once, in ``finally``, with the usage seen so far: N forwarded requests make
        # exactly N usage records.
        self.retries.requests += 1
        try:
            for attempt in range(1, self.settings.max_attempts + 1):
                if attempt > 1 and not self.retries.allows_retry():
                    last_error += "; no retry left in the gateway's retry budget"
                    break
                endpoint = self.decide.choose(
                    route, tried, affinity or reply.request_id, affinity, preview, hashes
                )
                if endpoint is None:
                    break
                tried.add(endpoint["url"])
                seen.restart(endpoint, attempt)
                self._address(payload, tenant, endpoint, path, client_salt)
                self.retries.retries += attempt > 1
                self.admission.start(endpoint, tenant)
                try:
                    await self._forward(reply, endpoint, path, payload, stream, asked_for_usage, seen)
                except (TimeoutError, aiohttp.ClientError, Upstream5xx) as exc:
                    if reply.client_gone:
                        raise
                    if reply.started:  # bytes already reached the client: nothing safe to retry
                        log.warning("upstream %s failed mid-response: %s", endpoint["url"], exc)
                        seen.status = 502
                        return
                    last_error = f"{endpoint['region']}: {exc or type(exc).__name__}"
                    if broken_connection(exc) and not reconnected:
                        # Most likely a kept-alive connection the engine closed as this request took it
                        # (vLLM closes idle ones after 5 s): nothing says the engine is down, so its
                        # circuit stays closed, and the request tries again on a new connection.
                        reconnected = True
                        tried.discard(endpoint["url"])
                        continue
                    self.decide.eject(endpoint, attempt, last_error)
                    preview = self._after_failure(endpoint, preview, seen)
                    continue
                finally:
                    self.retries.retries -= attempt > 1
                    self.admission.end(endpoint, tenant)
                self.breakers.success(endpoint["url"])
                if lookup is not None and seen.status == 200:
                    meta = entry_meta(endpoint, seen.content_type, seen.usage)
                    self.cache.put(lookup, endpoint, seen.kept, meta, stream)
                return
            seen.status = 502
            await reply.error(502, f"Every eligible endpoint failed ({last_error}).", "upstream_failed")
        except BaseException:
            seen.status = 499 if reply.client_gone else 502
            raise
        finally:
            self.retries.requests -= 1
            if seen.endpoint is not None:
                self._meter(reply, tenant, name, headers, priority, seen, started, wall, stream)
                self._mirror(reply, tenant, name, route, path, payload, client_salt, seen, stream)
            finish_span(span, seen, seen.attempt, reply.degraded, reply.cache)

    async def _answer_cached(
        self,
        reply: Reply,
        tenant: str,
        name: str,
        path: str,
        headers: dict[str, str],
        priority: str,
        hit: Hit,
        seen: Outcome,
    ) -> None:
        """The cached answer, metered as a request on the cache track (no GPU ran for it)."""
        started, wall = time.perf_counter(), datetime.now(UTC)
        span = self.tracing.start(
            headers, path, name, {"gateway.tenant": tenant, "gateway.priority": priority}
        )
        reply.trace_id, reply.cache = trace_id(span), "hit"
        seen.restart(cached_endpoint(hit.meta), 1)
        seen.usage = hit.meta.get("usage", {})
        extra = {"x-served-region": hit.meta["region"], "x-model-version": hit.meta["version"]}
        try:
            await reply.start(200, hit.meta["content_type"], extra, length=len(hit.body))
            seen.status, seen.ttft_ms = 200, (time.perf_counter() - started) * 1e3
            await reply.chunk(hit.body, more=False)
        except BaseException:
            seen.status = 499
            raise
        finally:
            stream = hit.meta["content_type"].startswith("text/event-stream")
            self._meter(reply, tenant, name, headers, priority, seen, started, wall, stream)
            finish_span(span, seen, 1, reply.degraded, reply.cache)

    def _after_failure(self, endpoint: contract.Endpoint, preview: str | None, seen: Outcome) -> str | None:
        """The revision the next attempt asks for: after a candidate failed, the stable one, so a failing
        candidate never fails a client's request (even at 100 % or under a preview header). The failure
        goes on the request's record, where the rollout's analysis counts it against the candidate."""
        if track_of(endpoint) != contract.CANDIDATE:
            return preview
        self.candidate_failures += 1
        seen.candidate_errors += 1
        return contract.STABLE

    def _address(
        self,
        payload: dict[str, Any],
        tenant: str,
        endpoint: contract.Endpoint,
        path: str,
        client_salt: str | None,
    ) -> None:
        """Rewrite the payload for this endpoint: the name its engine answers to, its cache salt."""
        payload["model"] = endpoint["served_model"]
        salt = self._cache_salt(tenant, endpoint, path, client_salt)
        if salt is None:
            payload.pop("cache_salt", None)
        else:
            payload["cache_salt"] = salt

    def _meter(
        self,
        reply: Reply,
        tenant: str,
        name: str,
        headers: dict[str, str],
        priority: str,
        seen: Outcome,
        started: float,
        wall: datetime,
        stream: bool,
    ) -> None:
        """The request's one usage record; never raises."""
        assert seen.endpoint is not None
        record = usage_record(
            request_id=reply.request_id,
            client_request_id=client_request_id(headers),
            tenant=tenant,
            model_name=name,
            outcome=seen,
            track=track_of(seen.endpoint),
            latency_ms=(time.perf_counter() - started) * 1e3,
            stream=stream,
            started_at=wall,
            served_model_name=reply.served_name,
            degraded=reply.degraded,
            trace_id=reply.trace_id,
            pipeline=reply.pipeline,
        )
        self.usage.record(record)
        self.metrics.observe(record, priority)

    def _mirror(
        self,
        reply: Reply,
        tenant: str,
        name: str,
        route: contract.Route,
        path: str,
        payload: dict[str, Any],
        client_salt: str | None,
        seen: Outcome,
        stream: bool,
    ) -> None:
        """Copy a request the stable revision served to the candidate beside it, if its split says so. Runs
        after the client's response is finished and only starts a task: it never delays or fails it."""
        assert self.session is not None and seen.endpoint is not None
        if seen.status >= 500 or reply.client_gone:
            return  # not served: there is no answer to compare the candidate's with
        try:
            shadow = mirror_target(route, seen.endpoint, reply.request_id)
            if shadow is None:
                return
            copy = dict(payload)  # the client's request is done: its payload is not written to again
            self._address(copy, tenant, shadow, path, client_salt)
            self.mirrors.send(self.session, MirrorCopy(tenant, name, shadow, path, copy, stream))
        except Exception:  # a copy is never worth a client's request
            log.exception("could not mirror %s", reply.request_id)

    def _cache_salt(
        self, tenant: str, endpoint: contract.Endpoint, path: str, client_salt: str | None
    ) -> str | None:
        """vLLM's ``cache_salt`` for this request: on a shared deployment always the tenant's own (a client's
        salt only subdivides it), so no tenant shares, or can time, another's cached prefixes."""
        if not endpoint.get("shared") or path in POOLING:
            return client_salt  # the tenant's own engine (or no prefix cache): the client decides
        salt = self.routes.body.get("cache_salts", {}).get(tenant)
        if not salt:
            salt = hmac.new(self.fallback_salt_key, tenant.encode(), hashlib.sha256).hexdigest()[:32]
        if client_salt:
            salt += "-" + hashlib.sha256(client_salt.encode()).hexdigest()[:32]
        return salt

    async def _forward(
        self,
        reply: Reply,
        endpoint: contract.Endpoint,
        path: str,
        payload: dict[str, Any],
        stream: bool,
        forward_usage_chunk: bool,
        seen: Outcome,
    ) -> None:
        """Send the engine's answer on; ``seen`` gets its status, TTFT and usage as soon as they are known."""
        assert self.session is not None
        data = json.dumps(payload).encode()
        sent = time.perf_counter()
        async with self.session.post(
            endpoint["url"] + path,
            data=data,
            headers={**engine_headers(endpoint, reply.request_id), **reply.trace_headers},
        ) as upstream:
            if upstream.status >= 500:
                raise Upstream5xx(f"answered {upstream.status}")
            extra = {
                "x-served-region": endpoint["region"],
                "x-model-version": endpoint["version"],
            }
            content_type = upstream.headers.get("Content-Type", "application/json")
            seen.content_type = content_type
            if stream and content_type.startswith("text/event-stream"):
                await reply.start(upstream.status, content_type, extra)
                seen.status = upstream.status
                events = EventFilter(forward_usage_chunk)
                async for chunk in upstream.content.iter_any():
                    if seen.ttft_ms is None:  # a stream's first event: what a user waits for
                        seen.ttft_ms = (time.perf_counter() - sent) * 1e3
                    data = events.feed(chunk)
                    seen.usage = events.usage  # tokens seen so far count even if the stream breaks
                    if data:
                        seen.keep(data)
                        await reply.chunk(data)
                rest = events.flush()
                seen.keep(rest)
                await reply.chunk(rest, more=False)
                return
            seen.ttft_ms = (time.perf_counter() - sent) * 1e3  # a whole answer's first byte: its headers
            body = await upstream.read()
            if upstream.status == 404 and path in POOLING and _route_missing(body):  # not "no such model"
                seen.status, seen.usage = 404, {}
                message = f"This model does not serve {path}: it runs another task."
                return await reply.error(404, message, "unsupported_endpoint", extra)
            seen.status = upstream.status
            try:
                seen.usage = json.loads(body).get("usage") or {}
            except (ValueError, AttributeError):
                seen.usage = {}
            seen.keep(body)
            await reply.start(upstream.status, content_type, extra, length=len(body))
            await reply.chunk(body, more=False)

    def _metrics_text(self) -> str:
        """Prometheus text: the usage spool; shadow copies (sent, dropped because too many were in flight,
        failed: 5xx, timeout or no connection); candidate attempts retried on the stable revision; requests
        held for a deployment at zero (waiting now, and how holds ended) and the activation calls."""
        rollout = {"candidate_failures": self.candidate_failures}
        return (
            exposition("gateway_usage_", self.usage.stats(), gauges={"backlog", "spool_bytes"})
            + exposition("gateway_mirrors_", self.mirrors.stats(), gauges={"in_flight"})
            + exposition("gateway_rollout_", rollout, gauges=set())
            + exposition("gateway_hold_", self.holds.stats(), gauges={"held_now"})
            + exposition("gateway_limits_", self.limits.stats(), gauges={"redis_configured", "redis_up"})
            + exposition("gateway_admission_", self.admission.stats(), gauges=set())
            + exposition("gateway_prefix_", self.prefixes.stats(), gauges={"entries"})
            + exposition("gateway_circuits_", self.breakers.stats(), gauges={"open", "half_open"})
            + exposition("gateway_response_cache_", self.cache.stats(), gauges={"stores"})
            + exposition(
                "gateway_retries_", self.retries.stats(), gauges={"requests_in_flight", "retries_in_flight"}
            )
            + self.metrics.text()
        )


def _route_missing(body: bytes) -> bool:
    """vLLM's (FastAPI's) answer on a path it did not mount (it mounts only its model's task's APIs), as
    opposed to its 404 of an unknown model name."""
    try:
        return bool(json.loads(body) == {"detail": "Not Found"})
    except ValueError:
        return False


app = Gateway(Settings.from_env())
