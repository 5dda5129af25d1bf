"""The global entry: one address for every client, forwarding each request to a regional gateway inside the
tenant's residency (gateway/topology.py explains the topology). ``python -m gateway --entry``."""

import asyncio
import logging
import uuid
from typing import Any

import aiohttp

from gateway.asgi import App, caller
from gateway.config import RouteCache, Settings
from gateway.inbound import Refused, parse_payload, read_body
from gateway.reply import Reply
from gateway.topology import serving_regions

log = logging.getLogger("gateway.entry")
# Not forwarded either way: they describe one hop's connection, not the request.
HOP_BY_HOP = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "content-length",
        "proxy-authorization",
        "proxy-connection",
        "trailer",
    }
)
# A regional gateway answering these (or not answering) did not serve the request: the next region may.
NOT_SERVED = frozenset({502, 503, 504})


class Entry(App):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.routes = RouteCache(settings, wants_secrets=False)
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.forwarded: dict[str, int] = {}  # per region: requests a regional gateway answered

    async def start(self) -> None:
        self.routes.load_from_disk()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=self.settings.connect_timeout_seconds,
                sock_read=self.settings.upstream_timeout_seconds,
            ),
            auto_decompress=False,
        )
        self.tasks = [asyncio.create_task(self.routes.follow(self.session))]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.session is not None:
            await self.session.close()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        reply = Reply(send, uuid.uuid4().hex)
        path, method = scope["path"], scope["method"]
        if sum(len(k) + len(v) for k, v in scope["headers"]) > self.settings.max_header_bytes:
            return await reply.error(431, "The request headers are too large.", "headers_too_large")
        if path in ("/healthz", "/readyz"):
            ready = bool(self.routes.body) or path == "/healthz"
            status = {
                "ready": bool(self.routes.body),
                "generation": self.routes.generation,
                "regions": sorted(self.settings.entry_regions),
                "forwarded": self.forwarded,
            }
            return await reply.json(200 if ready else 503, status)
        called = await caller(reply, self.routes, path, method, headers)
        if called is None:
            return
        view = self.routes.view(called[0])
        try:
            body = await read_body(receive, headers, self.settings.max_body_bytes)
            name = parse_payload(body, self.settings.max_json_depth)["model"]
        except Refused as bad:
            return await reply.error(bad.status, bad.message, bad.code)
        route = view["models"].get(name)
        pipeline = view.get("pipelines", {}).get(name) if route is None else None
        if route is not None:
            regions, unavailable = serving_regions(route), route.get("unavailable", "")
        elif pipeline is not None:
            # To a gateway in a region where the tenant's data may be processed (the pipeline's own
            # stages run there); that gateway routes its model stages as it routes any request.
            regions, unavailable = pipeline.get("regions", []), pipeline.get("unavailable", "")
        else:
            return await reply.error(
                404, f"The model '{name}' does not exist for this tenant.", "model_not_found"
            )
        places = [
            (code, self.settings.entry_regions[code])
            for code in regions
            if code in self.settings.entry_regions
        ]
        if not places:
            why = unavailable or "no region this tenant's residency allows has a gateway here"
            return await reply.error(
                503, f"The model '{name}' cannot be served now: {why}.", "model_unavailable"
            )
        forward = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
        for code, url in places:
            if await self._forward(send, reply, code, url + path, forward, body, last=code == places[-1][0]):
                return
        await reply.error(503, f"No regional gateway could serve '{name}' now.", "model_unavailable")

    async def _forward(
        self, send: Any, reply: Reply, region: str, url: str, headers: dict[str, str], body: bytes, last: bool
    ) -> bool:
        """Send the request to one regional gateway and its answer back; False if it did not serve it (no
        connection, or 502/503/504 while another region may: the last region's answer goes back as it is)."""
        assert self.session is not None
        started = False
        try:
            async with self.session.post(url, data=body, headers=headers) as upstream:
                if upstream.status in NOT_SERVED and not last:
                    log.warning("%s answered %s; trying the next region", region, upstream.status)
                    return False
                answer = [
                    (k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in upstream.headers.items()
                    if k.lower() not in HOP_BY_HOP
                ]
                await send({"type": "http.response.start", "status": upstream.status, "headers": answer})
                started = True
                self.forwarded[region] = self.forwarded.get(region, 0) + 1
                async for chunk in upstream.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return True
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, TimeoutError) as exc:
            if started:  # cut mid-answer: the client sees it cut, as from the regional gateway itself
                raise
            log.warning("%s unreachable (%s); trying the next region", region, exc)
            return False


app = Entry(Settings.from_env())
