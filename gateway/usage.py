"""Usage records, shipped to the control plane in batches; kept and re-sent until it accepts them.

The control plane keys records by request id, so a batch sent twice (a timeout after it was stored)
counts once.
"""

import asyncio
import logging
from collections import deque
from typing import Any

import aiohttp

from gateway.config import Settings

log = logging.getLogger("gateway")
MAX_BUFFERED = 100_000
BATCH = 500


class UsageShipper:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.pending: deque[dict[str, Any]] = deque(
            maxlen=MAX_BUFFERED
        )  # the oldest go first if it overflows

    def record(self, usage: dict[str, Any]) -> None:
        self.pending.append(usage)

    async def ship_once(self, session: aiohttp.ClientSession) -> int:
        batch = [self.pending[i] for i in range(min(BATCH, len(self.pending)))]
        if not batch:
            return 0
        async with session.post(
            f"{self.settings.control_plane}/api/v1/usage/",
            json={"records": batch},
            headers={"Authorization": f"Bearer {self.settings.token}"},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as reply:
            reply.raise_for_status()
        for _ in batch:
            self.pending.popleft()
        return len(batch)

    async def ship_forever(self, session: aiohttp.ClientSession, interval: float = 1.0) -> None:
        while True:
            try:
                while await self.ship_once(session) == BATCH:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane is down: keep the records
                log.warning("usage shipping failed (%s records kept): %s", len(self.pending), exc)
            await asyncio.sleep(interval)
