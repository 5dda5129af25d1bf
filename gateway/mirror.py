"""Shadow copies: a share of the requests the stable revision served is sent again, in the background, to
the rollout's candidate in the same region, so its latency and errors can be judged on real traffic.

The client never waits on a copy, never sees its answer and never pays for it: a copy starts after the
client's response is finished, runs as its own task under its own timeout, is dropped (and counted) when
``max_mirrors_in_flight`` copies are already running, and is not counted against the tenant's limits.
Each copy that was sent makes exactly one usage record with ``track: "mirror"`` and its own request id,
however it ends (an error, a timeout, the gateway stopping)."""

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gateway import contract
from gateway.balancer import engine_headers
from gateway.config import Settings
from gateway.metering import Outcome, usage_record
from gateway.streaming import EventFilter
from gateway.usage import UsageShipper

log = logging.getLogger("gateway")
GONE = 499  # the gateway stopped before the copy's answer came
TIMED_OUT = 504


@dataclass(frozen=True)
class MirrorCopy:
    """One request to copy: already addressed to the candidate (its model name and cache salt)."""

    tenant: str
    model_name: str
    endpoint: contract.Endpoint
    path: str
    payload: dict[str, Any]
    stream: bool


class Mirrors:
    def __init__(self, settings: Settings, usage: UsageShipper):
        self.settings, self.usage = settings, usage
        self.in_flight: set[asyncio.Task[None]] = set()  # also keeps each task referenced until it ends
        self.counts = {"sent": 0, "dropped": 0, "failed": 0}

    def send(self, session: aiohttp.ClientSession, copy: MirrorCopy) -> None:
        """Start the copy in the background, or drop it when the bound is reached; never blocks."""
        if len(self.in_flight) >= self.settings.max_mirrors_in_flight:
            self.counts["dropped"] += 1
            return
        task = asyncio.create_task(self._run(session, copy))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        self.counts["sent"] += 1

    def stats(self) -> dict[str, int]:
        return {**self.counts, "in_flight": len(self.in_flight)}

    async def drain(self, timeout: float) -> None:
        """Let copies in flight finish for up to ``timeout`` seconds, then cancel the rest (each still makes
        its record)."""
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=timeout)
        for task in set(self.in_flight):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def _run(self, session: aiohttp.ClientSession, copy: MirrorCopy) -> None:
        request_id, started, wall = uuid.uuid4().hex, time.perf_counter(), datetime.now(UTC)
        outcome = Outcome(endpoint=copy.endpoint, attempt=1)
        try:
            async with asyncio.timeout(self.settings.mirror_timeout_seconds):
                await _exchange(session, copy, request_id, outcome)
        except TimeoutError:
            outcome.status = TIMED_OUT
        except asyncio.CancelledError:
            outcome.status = GONE  # stopping: recorded below, not re-raised (nobody awaits a copy's result)
        except Exception as exc:  # the candidate's failure is data for the analysis, never the client's
            log.debug("mirror to %s failed: %s", copy.endpoint["url"], exc)
            outcome.status = 502
        finally:
            self._meter(copy, request_id, outcome, started, wall)

    def _meter(
        self, copy: MirrorCopy, request_id: str, outcome: Outcome, started: float, wall: datetime
    ) -> None:
        if outcome.status >= 500:
            self.counts["failed"] += 1
        record = usage_record(
            request_id=request_id,
            client_request_id="",  # the copy is not the client's request: its id must not list it
            tenant=copy.tenant,
            model_name=copy.model_name,
            outcome=outcome,
            track=contract.MIRROR,
            latency_ms=(time.perf_counter() - started) * 1e3,
            stream=copy.stream,
            started_at=wall,
        )
        try:
            self.usage.record(record)
        except Exception:  # a copy's record must never break the loop that serves clients
            log.exception("could not record mirror %s", request_id)


async def _exchange(
    session: aiohttp.ClientSession, copy: MirrorCopy, request_id: str, outcome: Outcome
) -> None:
    """Send the copy and read its answer to the end (discarding it), noting status, usage and TTFT."""
    sent = time.perf_counter()
    async with session.post(
        copy.endpoint["url"] + copy.path,
        data=json.dumps(copy.payload).encode(),
        headers=engine_headers(copy.endpoint, request_id),
    ) as upstream:
        outcome.status = upstream.status
        if copy.stream and upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            events = EventFilter(forward_usage_chunk=False)
            async for chunk in upstream.content.iter_any():
                if outcome.ttft_ms is None:
                    outcome.ttft_ms = (time.perf_counter() - sent) * 1e3
                events.feed(chunk)
                outcome.usage = events.usage
            return
        outcome.ttft_ms = (time.perf_counter() - sent) * 1e3
        body = await upstream.read()
        with contextlib.suppress(ValueError, AttributeError):
            outcome.usage = json.loads(body).get("usage") or {}
