"""One Redis store of the response cache (``gateway/response_cache.py``), as a busy gateway uses it.

- **Batched.** Lookups of concurrent requests go together: with nothing in flight a lookup goes at once
  (one round trip, no task to schedule); those arriving meanwhile wait and go as one ``MGET``. Answers to
  keep are gathered for ``WRITE_GATHER_SECONDS`` and written in pipelines of at most ``WRITE_BATCH``.
  redis-py spends about 100 µs of CPU on each command, so a busy gateway pays per batch, not per request.
- **Indexed.** Every entry belongs to a *member* (``jurisdiction:release:tenant``): the store keeps the
  set of members (``INDEX``) and, per member, the set of its keys, so deleting a member's entries
  (``purge``) reads its key set instead of scanning the store.
- **Never in the way.** Any failure (down, slow, refusing, a bug) is a miss or an answer not kept, never a
  failed request; after one, the store is skipped for ``RETRY_SECONDS`` so an outage costs requests no
  timeout each. The queue of answers to write is bounded in bytes; past it an answer is not kept.
"""

import asyncio
import contextlib
import logging
import time

from redis.asyncio import Redis

log = logging.getLogger("gateway")
PREFIX = "gwrc"
INDEX = f"{PREFIX}:index"  # every member with entries in this store
WRITE_GATHER_SECONDS = 0.005
WRITE_BATCH = 500  # entries per pipeline
RETRY_SECONDS = 5.0
MAX_QUEUED_BYTES = 64 * 2**20


def member_keys(member: str) -> str:
    """The set of a member's entry keys."""
    return f"{PREFIX}:keys:{member}"


class StorePipe:
    def __init__(self, name: str, client: Redis, counts: dict[str, int]):
        self.name, self.client, self.counts = name, client, counts
        self.gets: list[tuple[str, asyncio.Future[bytes | None]]] = []
        self.puts: list[tuple[str, bytes, str, int]] = []  # key, value, member, TTL
        self.queued_bytes = 0
        self.getting = False  # a lookup exchange is in flight: new lookups queue for the next one
        self.getter: asyncio.Task[None] | None = None
        self.putter: asyncio.Task[None] | None = None
        self.down_until = 0.0

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until

    async def get(self, key: str) -> bytes | None:
        """The value at ``key``; None when there is none or the store failed (a miss either way)."""
        if not self.up:
            self.counts["bypassed"] += 1
            return None
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

    async def _send_gets(self) -> None:
        batch: list[tuple[str, asyncio.Future[bytes | None]]] = []
        try:
            while self.gets:
                batch, self.gets = self.gets, []
                values = await self._mget([key for key, _ in batch])
                for (_, found), value in zip(batch, values, strict=True):
                    if not found.done():  # its request may be gone
                        found.set_result(value)
        finally:
            for _, found in [*batch, *self.gets]:  # whatever happened, nobody waits forever
                if not found.done():
                    found.set_result(None)
            self.gets = []
            self.getter, self.getting = None, False

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        try:
            values = await self.client.mget(keys)
        except Exception as exc:
            self._failed("lookup", exc, len(keys))
            return [None] * len(keys)
        return [value if isinstance(value, bytes) else None for value in values]

    def put(self, key: str, value: bytes, member: str, ttl_seconds: int) -> None:
        if not self.up or self.queued_bytes + len(value) > MAX_QUEUED_BYTES:
            self.counts["dropped"] += 1  # an answer not kept costs nothing
            return
        self.puts.append((key, value, member, ttl_seconds))
        self.queued_bytes += len(value)
        if self.putter is None:
            self.putter = asyncio.create_task(self._send_puts())

    async def _send_puts(self) -> None:
        try:
            while self.puts:
                # Nobody waits for a write: gathering a few ms of them makes one exchange of many.
                await asyncio.sleep(WRITE_GATHER_SECONDS)
                batch, self.puts = self.puts[:WRITE_BATCH], self.puts[WRITE_BATCH:]
                self.queued_bytes -= sum(len(value) for _, value, _, _ in batch)
                try:
                    await self._write(batch)
                except Exception as exc:
                    self._failed("write", exc, len(batch))
                else:
                    self.counts["stored"] += len(batch)
        finally:
            self.putter = None

    async def _write(self, batch: list[tuple[str, bytes, str, int]]) -> None:
        keys: dict[str, list[str]] = {}  # member → its keys in this batch
        longest: dict[str, int] = {}  # member → the longest TTL among them
        for key, _, member, ttl in batch:
            keys.setdefault(member, []).append(key)
            longest[member] = max(longest.get(member, 0), ttl)
        async with self.client.pipeline(transaction=False) as pipe:
            for key, value, _, ttl in batch:
                pipe.set(key, value, ex=ttl)
            for member, ttl in longest.items():
                pipe.sadd(member_keys(member), *keys[member])
                # The key set lives as long as its longest-lived entry.
                pipe.expire(member_keys(member), ttl, nx=True)
                pipe.expire(member_keys(member), ttl, gt=True)
            pipe.sadd(INDEX, *longest)
            await pipe.execute()

    async def purge(self, stale: set[str]) -> int:
        """Delete every entry of these members, and the members; the number of entries deleted."""
        deleted = 0
        for member in stale:
            keys = [key for key in await self.client.smembers(member_keys(member)) if isinstance(key, bytes)]
            for start in range(0, len(keys), 1000):
                deleted += await self.client.unlink(*keys[start : start + 1000])
            await self.client.unlink(member_keys(member))
            await self.client.srem(INDEX, member)
        return deleted

    async def members(self) -> set[str]:
        return {m.decode() if isinstance(m, bytes) else m for m in await self.client.smembers(INDEX)}

    def _failed(self, what: str, exc: BaseException, count: int) -> None:
        self.counts["errors"] += count
        if self.up:  # said once per outage, not once per batch
            log.warning(
                "response cache %s: %s failed (%s); serving uncached for %.0f s",
                self.name,
                what,
                exc or type(exc).__name__,
                RETRY_SECONDS,
            )
        self.down_until = time.monotonic() + RETRY_SECONDS

    async def drain(self, timeout: float) -> None:
        for task in (self.getter, self.putter):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), timeout)
