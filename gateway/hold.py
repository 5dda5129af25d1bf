"""Holding requests for a deployment at zero replicas until it has woken (scale-from-zero).

A route without endpoints that names an ``activatable`` region (the autoscaler idled it; residency already
applied by the route computation) does not answer 503: the request waits here, in a bounded queue per
(tenant, model), while the gateway asks the control plane to wake that region
(``POST /api/v1/routing/activations/``). Each new route table wakes the waiters; once the tenant's route
has endpoints they are released to it, the route the table gives that tenant, so a held request goes
nowhere a request arriving then could not go.

- at most ``hold_max_requests`` wait per (tenant, model); one more is refused at once (503
  ``activation_queue_full`` with ``Retry-After``);
- a request still waiting after ``hold_timeout_seconds`` gets 504 ``activation_timeout``;
- a client that disconnects while waiting (ASGI ``http.disconnect``) leaves the queue: it is never
  forwarded, so it makes no usage record;
- one activation call per (tenant, model) runs at a time, repeated every few seconds while requests wait
  and the table still says the region is at zero (the control plane treats repeats as no-ops); a failure
  is logged and counted, never raised: with the control plane down, held requests time out cleanly.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gateway import contract
from gateway.config import RouteCache, Settings

log = logging.getLogger("gateway")
ACTIVATION_RETRY_SECONDS = 3.0  # between calls while requests wait and the table still says "at zero"
ACTIVATION_CALL_SECONDS = 5.0  # one call's whole exchange
RETRY_AFTER_SECONDS = 10  # a full queue: by then the engine has usually started and the queue drained

Key = tuple[str, str]  # (tenant, model name)


class HoldRefused(Exception):
    """The held request is answered with this error instead of being forwarded."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}


class ClientGone(Exception):
    """The client disconnected while its request was held: there is no one to answer."""


@dataclass(frozen=True)
class Held:
    """A request released from the queue: the route it goes to, and when its hold began."""

    route: contract.Route
    since: float  # time.perf_counter() when the hold began: the usage record's latency counts from it
    wall: datetime  # the same instant on the wall clock: the usage record's started_at
    released: float = field(default_factory=time.perf_counter)

    @property
    def waited_ms(self) -> float:
        return (self.released - self.since) * 1e3


class Holds:
    def __init__(self, settings: Settings, routes: RouteCache):
        self.settings, self.routes = settings, routes
        self.waiting: dict[Key, int] = {}
        self.signallers: dict[Key, asyncio.Task[None]] = {}
        self.counts = {
            "held": 0,
            "released": 0,
            "timed_out": 0,
            "rejected_full": 0,
            "dropped_disconnected": 0,
            "activations": 0,
            "activation_errors": 0,
        }

    def stats(self) -> dict[str, int]:
        """What /healthz and /metrics report: requests waiting now, and counters since the process started."""
        return {"held_now": sum(self.waiting.values()), **self.counts}

    async def hold(self, session: aiohttp.ClientSession, tenant: str, name: str, receive: Any) -> Held:
        """Wait until ``tenant``'s route for ``name`` has endpoints; raises HoldRefused (queue full,
        timeout, the model gone from the table) or ClientGone."""
        since, wall, key = time.perf_counter(), datetime.now(UTC), (tenant, name)
        self._join(key)
        self._signal(session, key)
        try:
            route = await asyncio.wait_for(
                self._until_served(tenant, name, receive), self.settings.hold_timeout_seconds
            )
        except TimeoutError:
            self.counts["timed_out"] += 1
            raise HoldRefused(
                504,
                f"'{name}' did not start within {self.settings.hold_timeout_seconds:g} s of this request.",
                "activation_timeout",
            ) from None
        except ClientGone:
            self.counts["dropped_disconnected"] += 1
            raise
        finally:
            self._leave(key)
        self.counts["released"] += 1
        return Held(route, since, wall)

    def _join(self, key: Key) -> None:
        """Take a place in ``key``'s queue, or refuse the request at once when it is full."""
        if self.waiting.get(key, 0) >= self.settings.hold_max_requests:
            self.counts["rejected_full"] += 1
            raise HoldRefused(
                503,
                f"'{key[1]}' is starting from zero and {self.settings.hold_max_requests} requests already "
                f"wait for it; retry in {RETRY_AFTER_SECONDS} s.",
                "activation_queue_full",
                {"retry-after": str(RETRY_AFTER_SECONDS)},
            )
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self.counts["held"] += 1

    async def _until_served(self, tenant: str, name: str, receive: Any) -> contract.Route:
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while True:
                changed = self.routes.changed()  # taken before reading the table, so no table is missed
                route = self.routes.view(tenant)["models"].get(name)
                if route is None:
                    raise HoldRefused(
                        404, f"The model '{name}' does not exist for this tenant.", "model_not_found"
                    )
                if route["endpoints"]:
                    return route
                if "activatable" not in route:  # paused by hand, failed, no longer compliant: not coming
                    raise HoldRefused(
                        503,
                        route.get("unavailable", "No region can serve this model."),
                        "residency_unavailable",
                    )
                await _next_table(changed, gone)
        finally:
            gone.cancel()

    def _leave(self, key: Key) -> None:
        left = self.waiting[key] - 1
        if left:
            self.waiting[key] = left
            return
        del self.waiting[key]
        signaller = self.signallers.pop(key, None)  # nobody waits: stop asking (the next hold starts anew)
        if signaller is not None:
            signaller.cancel()

    # --- telling the control plane -------------------------------------------------------------------
    def _signal(self, session: aiohttp.ClientSession, key: Key) -> None:
        """Start the one activation loop of ``key`` unless it runs (one that just ended counts as not)."""
        running = self.signallers.get(key)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._activate_while_held(session, key))
        self.signallers[key] = task
        task.add_done_callback(lambda done: self._forget_signaller(key, done))

    def _forget_signaller(self, key: Key, task: asyncio.Task[None]) -> None:
        if self.signallers.get(key) is task:
            del self.signallers[key]

    async def _activate_while_held(self, session: aiohttp.ClientSession, key: Key) -> None:
        tenant, name = key
        while self.waiting.get(key):
            route = self.routes.view(tenant)["models"].get(name)
            if route is not None and "activatable" in route:  # else it is starting: nothing to ask
                await self._activate(session, tenant, name, self.waiting[key])
            await asyncio.sleep(ACTIVATION_RETRY_SECONDS)

    async def _activate(self, session: aiohttp.ClientSession, tenant: str, name: str, held: int) -> None:
        body: contract.Activation = {"tenant": tenant, "model": name, "held": held}
        try:
            async with session.post(
                f"{self.settings.control_plane}/api/v1/routing/activations/",
                json=body,
                headers={"Authorization": f"Bearer {self.settings.token}"},
                timeout=aiohttp.ClientTimeout(total=ACTIVATION_CALL_SECONDS),
            ) as reply:
                if reply.status != 202:
                    raise RuntimeError(f"answered {reply.status}: {(await reply.text())[:300]}")
            self.counts["activations"] += 1
        except Exception as exc:  # the control plane down, a 409: the held requests wait on (or time out)
            self.counts["activation_errors"] += 1
            log.warning(
                "activating %s's %s (%s held) failed: %s", tenant, name, held, exc or type(exc).__name__
            )

    async def stop(self) -> None:
        for task in list(self.signallers.values()):
            task.cancel()
        await asyncio.gather(*self.signallers.values(), return_exceptions=True)


async def _disconnected(receive: Any) -> None:
    """Returns when the client disconnects: after the whole body, ASGI's receive() waits for just that."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _next_table(changed: asyncio.Event, gone: "asyncio.Future[Any]") -> None:
    """Wait for the next route table; ClientGone if the client disconnects first."""
    table: asyncio.Future[Any] = asyncio.ensure_future(changed.wait())
    try:
        await asyncio.wait({table, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        table.cancel()
    if gone.done():
        raise ClientGone
