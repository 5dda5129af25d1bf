"""What the gateway and the global entry share as ASGI apps: the lifespan protocol, and the checks every
call to the OpenAI-compatible API passes before it is read (path, method, a route table, the token)."""

from typing import Any

from gateway.config import RouteCache
from gateway.inbound import METHODS, bearer_digest
from gateway.reply import Reply


class App:
    """An ASGI app with a lifespan: ``start`` before the first request, ``stop`` at shutdown."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None: ...

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "http":
            await self.handle(scope, receive, send)


async def caller(
    reply: Reply, routes: RouteCache, path: str, method: str, headers: dict[str, str]
) -> tuple[str, str] | None:
    """(tenant, token digest) of an API call, or None once it was answered here: an unknown path (404) or
    method (405), no route table yet (503), no valid token (401), or the tenant's model list."""
    # Which paths exist is no secret: unknown paths are 404 and wrong methods 405, before the token.
    allowed = METHODS.get(path)
    if allowed is None:
        await reply.error(404, f"No route for {method} {path}.", "not_found")
        return None
    if method != allowed:
        await reply.error(
            405, f"{path} takes {allowed}, not {method}.", "method_not_allowed", {"allow": allowed}
        )
        return None
    if not routes.body:
        await reply.error(503, "The gateway has no route table yet.", "no_route_table")
        return None
    digest = bearer_digest(headers)
    tenant = routes.tenant_of(digest, headers.get("openai-organization")) if digest else None
    if tenant is None or digest is None:
        await reply.error(401, "A valid API token is required (Authorization: Bearer …).", "invalid_api_key")
        return None
    if path == "/v1/models":
        models = [
            {"id": name, "object": "model", "owned_by": tenant} for name in routes.view(tenant)["models"]
        ]
        await reply.json(200, {"object": "list", "data": models})
        return None
    return tenant, digest
