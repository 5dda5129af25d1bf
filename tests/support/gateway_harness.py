"""The gateway in-process, with a fake engine and a fake control plane as local HTTP servers (no database).

``GatewayWorld`` builds a route table for two tenants (``acme`` and ``globex``, one token each) whose model
``chat`` is served by one fake engine (dedicated to acme; ``shared`` is offered to both), and calls the
gateway's ASGI app directly: fast enough for property tests, and the same code path as uvicorn's.
"""

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway import contract
from gateway.app import Gateway
from gateway.config import Settings

TOKENS = {"acme": "cpt_acme0000_secret", "globex": "cpt_globex00_secret"}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def serve(answer: Callable[[BaseHTTPRequestHandler, bytes], None]) -> tuple[str, ThreadingHTTPServer]:
    """A local HTTP server whose handler calls ``answer(handler, body)``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: Nagle would hold the body 40 ms

        def do_GET(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            answer(self, self.rfile.read(length) if length else b"")

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client closing a kept-alive connection is not news

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", server


def reply(handler: BaseHTTPRequestHandler, status: int, body: Any, content_type: str = "") -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type or "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@dataclass
class FakeEngine:
    """Answers chat/completions like vLLM: JSON, or SSE whose last chunk carries usage when asked."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    usage: Any = None  # what the engine reports as ``usage`` (None: the normal counts)
    break_stream: bool = False  # send the first event, then drop the connection mid-response
    fail_status: int = 0  # answer every request with this status (a 5xx: a failing engine)
    fail_body: Any = None  # and this body (None: an error envelope)
    delay: float = 0.0  # seconds to think before answering (a slow engine)
    hold: threading.Event | None = None  # answer only once this is set (an engine stuck until released)
    drop: int = 0  # close the connection unanswered this many times (as a closing kept-alive one looks)

    def start(self) -> "FakeEngine":
        self.url, self.server = serve(self.answer)
        return self

    def answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        payload = json.loads(body)
        self.seen.append({"body": payload, "headers": dict(handler.headers)})
        usage = self.usage or {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if self.drop > 0:
            self.drop -= 1
            handler.close_connection = True
            return
        if self.hold is not None:
            self.hold.wait(timeout=60)
        if self.delay:
            time.sleep(self.delay)
        if self.fail_status:
            body = self.fail_body or {"error": {"message": "engine failing"}}
            return reply(handler, self.fail_status, body)
        if self.break_stream:
            first = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Content-Length", "100000")
            handler.end_headers()
            handler.wfile.write(b"data: " + json.dumps(first).encode() + b"\n\n")
            handler.wfile.flush()
            handler.close_connection = True
            return
        if not payload.get("stream"):
            return reply(
                handler, 200, {"object": "chat.completion", "choices": [{"index": 0}], "usage": usage}
            )
        events = [
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": w}}]}
            for w in "ab"
        ]
        if (payload.get("stream_options") or {}).get("include_usage"):
            events.append({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        reply(handler, 200, data, "text/event-stream")


@dataclass
class FakeControlPlane:
    """Serves one route table and stores usage batches; ``down`` answers 503, ``refuse`` a 400 per batch."""

    table: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    refuse: Callable[[dict[str, Any]], bool] = lambda record: False
    name_refused: bool = True  # say which record was refused ("records[3]: ...")
    lose_replies: bool = False  # store the batch, then answer 503 (the reply lost on the way back)
    batches: int = 0
    activations: list[dict[str, Any]] = field(default_factory=list)  # bodies of POST .../activations/
    indexes: dict[str, dict[str, Any]] = field(default_factory=dict)  # "acme/handbook" → the index
    index_fetches: int = 0
    url: str = ""

    def start(self) -> "FakeControlPlane":
        self.url, self.server = serve(self.answer)
        return self

    def answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if self.down:
            return reply(handler, 503, {"error": {"message": "down"}})
        if handler.path.startswith("/api/v1/routing/indexes/"):
            self.index_fetches += 1
            path = urlsplit(handler.path).path
            found = self.indexes.get(path.removeprefix("/api/v1/routing/indexes/").strip("/"))
            return reply(handler, 200, found) if found else reply(handler, 404, {"error": {"message": "no"}})
        if handler.path.startswith("/api/v1/routing/activations/"):
            self.activations.append(json.loads(body))
            return reply(handler, 202, {"deployment": 1, "region": "eu-west-1", "replicas": 1, "woke": True})
        if handler.path.startswith("/api/v1/usage/"):
            batch = json.loads(body)["records"]
            self.batches += 1
            bad = [n for n, r in enumerate(batch) if self.refuse(r)]
            if bad:
                message = f"records[{bad[0]}]: refused." if self.name_refused else "Refused."
                return reply(handler, 400, {"error": {"code": "validation_failed", "message": message}})
            known = {r["request_id"] for r in self.records}
            fresh = [r for r in batch if r["request_id"] not in known]
            self.records += fresh
            if self.lose_replies:
                return reply(handler, 503, {"error": {"message": "reply lost"}})
            return reply(handler, 200, {"accepted": len(fresh), "duplicates": len(batch) - len(fresh)})
        return reply(handler, 200, {"generation": 1, "etag": "one", "table": self.table})


def endpoint(url: str, shared: bool = False) -> dict[str, Any]:
    return {
        "url": url,
        "region": "eu-west-1",
        "priority": 0,
        "weight": 100,
        "deployment": 1,
        "version": "m@1",
        "served_model": "m",
        "artifact_sha256": "",
        "shared": shared,
    }


def rollout_endpoint(
    url: str,
    region: str = "eu-west-1",
    track: str = contract.STABLE,
    priority: int = 0,
    deployment: int = 1,
) -> dict[str, Any]:
    """An endpoint of one revision: the stable one serves ``m@1``, the candidate ``m@2``."""
    version = "m@2" if track == contract.CANDIDATE else "m@1"
    return {**endpoint(url), "region": region, "priority": priority, "deployment": deployment} | {
        "version": version,
        "track": track,
    }


def rollout_route(endpoints: list[dict[str, Any]], splits: dict[str, dict[str, int]]) -> dict[str, Any]:
    route: dict[str, Any] = {"endpoints": endpoints, "preferred": endpoints[0]["region"]}
    if splits:
        route["splits"] = splits
    return route


def route_table(engine_url: str) -> dict[str, Any]:
    dedicated = {"endpoints": [endpoint(engine_url)], "preferred": "eu-west-1"}
    shared = {"endpoints": [endpoint(engine_url, shared=True)], "preferred": "eu-west-1"}
    return {
        "tenants": {
            "acme": {"limits": {}, "blocked": "", "models": {"chat": dedicated, "shared": shared}},
            "globex": {"limits": {}, "blocked": "", "models": {"shared": shared}},
        },
        "credentials": {digest(t): {"tenants": [slug], "expires": None} for slug, t in TOKENS.items()},
        "cache_salts": {slug: hashlib.sha256(f"salt:{slug}".encode()).hexdigest()[:32] for slug in TOKENS},
    }


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def settings(state_dir: Path, control_plane: str = "http://127.0.0.1:9", **extra: Any) -> Settings:
    if "state_dir" in Settings.__dataclass_fields__:
        extra.setdefault("state_dir", state_dir)
    return Settings(
        control_plane=control_plane, token="gateway-token", cache_file=state_dir / "routes.json", **extra
    )


class GatewayWorld:
    """A gateway (not started: no background tasks) with a table loaded, and a loop to call it in."""

    def __init__(self, state_dir: Path, **extra: Any):
        extra.setdefault("stage_networks", ("127.0.0.0/8",))  # the tests' http stages run on this host
        self.engine = FakeEngine().start()
        self.extra_engines: list[FakeEngine] = []
        self.control = FakeControlPlane(route_table(self.engine.url)).start()
        # The loop runs on a thread of its own: the main thread may already have a running loop (Playwright's
        # sync API keeps one there while a session-scoped browser is open), and run_until_complete refuses
        # to start a second loop in a thread that has one.
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="gateway-loop", daemon=True)
        self.loop_thread.start()
        self.gateway = Gateway(settings(state_dir, self.control.url, **extra))
        self.gateway.routes.body = self.control.table
        getattr(self.gateway.usage, "open", lambda: None)()
        self.gateway.session = self.run(self._session())

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(auto_decompress=False)

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=300)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | list[Any] = b"",
        headers: dict[str, str] | None = None,
        tenant: str | None = "acme",
        chunks: list[bytes] | None = None,
    ) -> Answer:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = dict(headers or {})
        if tenant:
            sent.setdefault("Authorization", f"Bearer {TOKENS[tenant]}")
        return self.run(self._call(method, path, chunks if chunks is not None else [data], sent))

    async def _call(self, method: str, path: str, chunks: list[bytes], headers: dict[str, str]) -> Answer:
        scope = {
            "type": "http",
            "client": ("127.0.0.1", 50000),  # a client on this host, as uvicorn reports it
            "method": method,
            "path": path,
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        }
        pending = list(chunks)
        read = {"messages": 0}

        async def receive() -> dict[str, Any]:
            read["messages"] += 1
            if not pending:
                return {"type": "http.disconnect"}
            body = pending.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pending)}

        status, got, parts = 0, {}, []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, got
            if message["type"] == "http.response.start":
                status = message["status"]
                got = {k.decode(): v.decode() for k, v in message["headers"]}
            else:
                parts.append(message.get("body", b""))

        await self.gateway.handle(scope, receive, send)
        self.messages_read = read["messages"]
        return Answer(status, got, b"".join(parts))

    def chat(
        self, tenant: str = "acme", model: str = "chat", headers: dict[str, str] | None = None, **extra: Any
    ) -> Answer:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        return self.call("POST", "/v1/chat/completions", body, headers, tenant)

    def serve(self, route: dict[str, Any]) -> None:
        """Make ``route`` acme's ``chat`` (a new route table generation, as far as the gateway can tell)."""
        self.gateway.routes.body["tenants"]["acme"]["models"]["chat"] = route

    def engines(self, count: int) -> list[FakeEngine]:
        """More engines, stopped with the world."""
        started = [FakeEngine().start() for _ in range(count)]
        self.extra_engines += started
        return started

    def settle(self, timeout: float = 30) -> None:
        """Wait for the shadow copies in flight to end (those still running after ``timeout`` are cut)."""
        self.run(self.gateway.mirrors.drain(timeout))

    def ship(self) -> int:
        total = 0
        while True:
            shipped = self.run(self.gateway.usage.ship_once(self.gateway.session))
            total += shipped
            if not shipped:
                return total

    def close(self) -> None:
        for engine in self.extra_engines:
            if engine.hold is not None:
                engine.hold.set()
        self.run(self.gateway.mirrors.drain(timeout=0))
        self.run(self.gateway.session.close())
        self.run(self.gateway.stage_network.close())
        getattr(self.gateway.usage, "close", lambda: None)()
        for engine in [self.engine, *self.extra_engines]:
            engine.server.shutdown()
        self.control.server.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(timeout=10)
        self.loop.close()


class Service:
    """A tenant's service behind an http stage: answers {"output": answer(inputs)}, remembers what it got."""

    def __init__(self, answer: Any, delay: float = 0.0, barrier: threading.Barrier | None = None):
        self.got: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.answer, self.delay, self.barrier = answer, delay, barrier
        self.url, self.server = serve(self._answer)

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        inputs = json.loads(body)["inputs"]
        self.got.append(inputs)
        self.authorizations.append(handler.headers.get("Authorization"))
        if self.barrier is not None:
            self.barrier.wait()  # returns only while the other stage's request is in flight too
        time.sleep(self.delay)
        reply(handler, 200, {"output": self.answer(inputs)})

    def close(self) -> None:
        self.server.shutdown()
