"""Usage records, spooled to disk and shipped to the control plane in order, until it accepts them.

Usage is billing data, so a record is never dropped while disk remains:

- ``record()`` appends one JSON line to the current spool segment (``usage-<slot>-<seq>.spool`` under the
  gateway's state dir) and flushes it to the kernel, so a killed process loses nothing; the shipping loop
  fsyncs about once a second (a power cut loses at most that second). If the disk refuses the write, the
  line is kept in memory and written (or shipped) as soon as it can be; the segment is first truncated
  back to the end of its last whole write (or, if even that fails, a new segment is started), so a
  write that failed halfway never leaves a fragment for the retried lines to be glued to.
- The shipper reads the oldest segment from the offset it has reached (``usage-<slot>.offset``: segment
  and byte), posts up to ``BATCH`` records, then advances the offset; a fully shipped segment that is no
  longer written to is deleted. A restart replays from the offset, in order; a batch re-sent after a
  crash counts once because the control plane deduplicates by the gateway's own request id.
- A batch the control plane refuses (400/422) does not stall the queue: the refused record (the one the
  error names, else each one found by sending them singly) goes to ``usage-<slot>.quarantine`` with the
  reason, is counted, and the rest ship. Other failures (down, 5xx, 401) keep everything for a retry.
- Each gateway process claims a slot with an exclusive ``flock``, so ``--workers N`` never share a file
  and a restarted process takes over (and replays) the slot a dead one left.
- A slot no live process holds is adopted (at startup and every ``ADOPT_EVERY`` shipping rounds): the
  process takes its lock, ships its backlog in order after its own, then deletes its emptied files and
  releases it. So running fewer workers than before (``--workers 2`` then 1) loses nothing.
"""

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
from pathlib import Path
from typing import IO, Any

import aiohttp

from gateway import contract
from gateway.config import Settings

log = logging.getLogger("gateway")
BATCH = 500
SEGMENT_BYTES = 16 * 2**20  # a segment past this is closed and a new one started
ROTATE_WHEN_CAUGHT_UP = 2**20  # a shipped segment this big is closed at once so its disk is freed
REFUSED = (400, 422)
ADOPT_EVERY = 30  # shipping rounds (about a second each) between looks for orphaned slots
_INDEX = re.compile(r"records\[(\d+)\]")
_SEGMENT = re.compile(r"usage-(\d+)-(\d+)\.spool")


class UsageShipper:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.dir = settings.usage_dir()
        self.memory: list[bytes] = []  # lines the disk refused, oldest first
        self.counts = {"spooled": 0, "shipped": 0, "quarantined": 0, "write_errors": 0}
        self.backlog = 0
        self.lock: IO[str] | None = None
        self.adopted: list[UsageShipper] = []  # orphaned slots this process is shipping
        self.good_at = 0  # the end of the last whole line in the segment being written
        self.torn = False  # a failed write may have left a fragment after good_at

    def open(self) -> None:
        """Claim a slot and take over its spool (at startup, not at import: workers each claim one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._take(*_claim_slot(self.dir))
        self.adopt_orphans()

    def _take(self, slot: int, lock: IO[str]) -> None:
        """Open the spool of a slot whose lock this process holds, from the offset it had reached."""
        self.slot, self.lock = slot, lock
        self.offset_path = self.dir / f"usage-{self.slot}.offset"
        self.quarantine_path = self.dir / f"usage-{self.slot}.quarantine"
        self.read_seq, self.read_at = self._load_offset()
        segments = self._segments()
        for seq in [s for s in segments if s < self.read_seq]:
            self._segment(seq).unlink(missing_ok=True)  # shipped before a crash
        if segments and self.read_seq not in segments:
            self.read_seq, self.read_at = min(s for s in segments if s >= self.read_seq), 0
        self.write_seq = max([*segments, self.read_seq]) + 1  # never append after a torn line
        if not segments:
            self.read_seq, self.read_at = self.write_seq, 0
        self._open_writer()
        self.backlog += sum(self._unshipped_lines(seq) for seq in segments if seq >= self.read_seq)
        self._write_memory()  # anything recorded before the spool was open

    def adopt_orphans(self) -> None:
        """Take over every slot that has spool segments and no live process (fewer workers than before,
        or a worker that died and was not replaced); its records ship after this slot's own."""
        if self.lock is None:
            return
        held = {self.slot, *(orphan.slot for orphan in self.adopted)}
        for slot in sorted(_spooled_slots(self.dir) - held):
            lock = _try_lock(self.dir, slot)
            if lock is None:
                continue  # a live process has it
            orphan = UsageShipper(self.settings)
            orphan.counts = self.counts  # one set of counters per process
            orphan._take(slot, lock)
            log.warning("adopted usage spool slot %s (%s records to ship)", slot, orphan.backlog)
            self.adopted.append(orphan)

    def _release(self) -> None:
        """Done with an adopted slot: delete its shipped files (never the lock file) and let it go."""
        assert self.lock is not None
        self.writer.close()
        if self.backlog <= 0 and not self.memory:
            for seq in self._segments():
                self._segment(seq).unlink(missing_ok=True)
            self.offset_path.unlink(missing_ok=True)
        self.lock.close()
        self.lock = None

    # --- writing ---------------------------------------------------------------------------------------
    def record(self, usage: contract.UsageRecord) -> None:
        self.memory.append(json.dumps(usage, separators=(",", ":")).encode() + b"\n")
        self.counts["spooled"] += 1
        self.backlog += 1
        self._write_memory()

    def _write_memory(self) -> None:
        if not self.memory or self.lock is None:
            return
        written = len(self.memory)
        data = memoryview(b"".join(self.memory))
        try:
            if self.torn:
                self._untear()
            if self.good_at > SEGMENT_BYTES:
                self._rotate()
            while data:  # unbuffered: what the disk took is on it, nothing waits in a buffer
                took = self.writer.write(data)
                if not took:
                    raise OSError(errno.EIO, "the spool segment took no bytes")
                data = data[took:]
        except OSError as exc:  # disk full or gone: keep the lines in memory, never drop them
            self.counts["write_errors"] += 1
            self.torn = True
            log.error("usage spool write failed (%s records in memory): %s", len(self.memory), exc)
            with contextlib.suppress(OSError):
                self._untear()
            return
        self.good_at += sum(len(line) for line in self.memory[:written])
        del self.memory[:written]

    def _untear(self) -> None:
        """Cut what a failed write left after the last whole line (a new segment if the cut fails)."""
        try:
            os.truncate(self._segment(self.write_seq), self.good_at)
        except OSError:
            self._rotate()  # the reader quarantines the old segment's fragment; its lines are in memory
        self.torn = False

    def _rotate(self) -> None:
        self.writer.close()
        self.write_seq += 1
        self._open_writer()

    def _open_writer(self) -> None:
        self.writer: IO[bytes] = self._segment(self.write_seq).open("ab", buffering=0)
        self.good_at = self.writer.seek(0, os.SEEK_END)
        self.torn = False

    def sync(self) -> None:
        """fsync what was written: what a power cut (not a mere crash) would otherwise lose."""
        if self.lock is None:
            return
        self._write_memory()
        try:
            os.fsync(self.writer.fileno())
        except (OSError, ValueError) as exc:  # ValueError: no segment open (the disk refused a new one)
            log.error("usage spool fsync failed: %s", exc)

    # --- shipping --------------------------------------------------------------------------------------
    async def ship_once(self, session: aiohttp.ClientSession) -> int:
        """Ship the next batch in order; the number of records it took off the spool."""
        if self.lock is None:
            return 0
        for orphan in list(self.adopted):  # an orphan's records are older than anything written now
            count = await orphan.ship_once(session)
            if count:
                return count
            if orphan.backlog <= 0 and not orphan.memory:
                orphan._release()
                self.adopted.remove(orphan)
        self._write_memory()
        while True:
            lines, end = self._read_batch()
            if lines:
                await self._deliver(session, lines)
            if end != self.read_at:
                self.read_at = end
                self._save_offset()
            moved_on = self._advance_segment()
            if lines:
                return self._shipped(len(lines))
            if not moved_on:  # an empty or finished segment: try the next one at once
                break
        if self.memory:  # the disk refuses writes: ship straight from memory, after everything on disk
            taken = self.memory[:BATCH]
            await self._deliver(session, taken)
            # record() may have run meanwhile, written memory to disk (those lines ship from there) and
            # added newer lines: remove exactly the shipped lines that are still here.
            shipped = {id(line) for line in taken}
            kept = [line for line in self.memory if id(line) not in shipped]
            self.backlog -= len(self.memory) - len(kept)
            self.memory = kept
            return len(taken)
        return 0

    def _shipped(self, count: int) -> int:
        self.backlog -= count
        return count

    async def _deliver(self, session: aiohttp.ClientSession, lines: list[bytes]) -> None:
        """Post the records; refused ones are quarantined, anything else unexpected raises (retry)."""
        records: list[Any] = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                self._quarantine(line.decode("utf-8", "replace").rstrip("\n"), "unreadable spool line")
        while records:
            status, reason = await self._post(session, records)
            if status not in REFUSED:
                self.counts["shipped"] += len(records)
                return
            index = _refused_index(reason, len(records))
            if index is None:
                return await self._deliver_singly(session, records)
            self._quarantine(records.pop(index), reason)

    async def _deliver_singly(self, session: aiohttp.ClientSession, records: list[Any]) -> None:
        for record in records:
            status, reason = await self._post(session, [record])
            if status in REFUSED:
                self._quarantine(record, reason)
            else:
                self.counts["shipped"] += 1

    async def _post(self, session: aiohttp.ClientSession, records: list[Any]) -> tuple[int, str]:
        batch: contract.UsageBatch = {"records": records}  # as spooled (a refused one is quarantined)
        async with session.post(
            f"{self.settings.control_plane}/api/v1/usage/",
            json=batch,
            headers={"Authorization": f"Bearer {self.settings.token}"},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as reply:
            if reply.status in REFUSED:
                return reply.status, (await reply.text())[:2000]
            reply.raise_for_status()
            return reply.status, ""

    def _quarantine(self, record: Any, reason: str) -> None:
        entry = json.dumps({"record": record, "reason": reason}) + "\n"
        with self.quarantine_path.open("a") as out:
            out.write(entry)
            out.flush()
            os.fsync(out.fileno())
        self.counts["quarantined"] += 1
        log.error("usage record quarantined in %s: %s", self.quarantine_path, reason[:200])

    async def ship_forever(self, session: aiohttp.ClientSession) -> None:
        rounds = 0
        while True:
            try:
                rounds += 1
                if rounds % ADOPT_EVERY == 0:
                    self.adopt_orphans()
                self.sync()
                while await self.ship_once(session) == BATCH:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane is down: the records stay spooled
                log.warning("usage shipping failed (%s records spooled): %s", self.backlog, exc)
            await asyncio.sleep(self.settings.usage_interval_seconds)

    # --- the spool on disk -----------------------------------------------------------------------------
    def _segment(self, seq: int) -> Path:
        return self.dir / f"usage-{self.slot}-{seq}.spool"

    def _segments(self) -> list[int]:
        prefix = f"usage-{self.slot}-"
        found = [p.name[len(prefix) : -len(".spool")] for p in self.dir.glob(f"{prefix}*.spool")]
        return sorted(int(seq) for seq in found if seq.isdigit())

    def _read_batch(self) -> tuple[list[bytes], int]:
        """Up to BATCH whole lines from the read position, and the byte after the last one."""
        path = self._segment(self.read_seq)
        if not path.exists():
            return [], self.read_at
        lines: list[bytes] = []
        at = self.read_at
        with path.open("rb") as spool:
            spool.seek(at)
            while len(lines) < BATCH:
                line = spool.readline()
                if not line.endswith(b"\n"):
                    if line and self.read_seq != self.write_seq:  # torn by a crash, never completed
                        self._quarantine(line.decode("utf-8", "replace"), "torn spool line")
                        at += len(line)
                    break
                lines.append(line)
                at += len(line)
        return lines, at

    def _advance_segment(self) -> bool:
        """Past the end of a closed segment: delete it and read the next one (True when it did)."""
        size = self._segment(self.read_seq).stat().st_size if self._segment(self.read_seq).exists() else 0
        if self.read_at < size:
            return False
        if self.read_seq == self.write_seq:
            if size < ROTATE_WHEN_CAUGHT_UP or self.memory:
                return False
            self._rotate()
        self._segment(self.read_seq).unlink(missing_ok=True)
        self.read_seq, self.read_at = self.read_seq + 1, 0
        self._save_offset()
        return True

    def _unshipped_lines(self, seq: int) -> int:
        with self._segment(seq).open("rb") as spool:
            if seq == self.read_seq:
                spool.seek(self.read_at)
            return spool.read().count(b"\n")

    def _load_offset(self) -> tuple[int, int]:
        try:
            seq, at = self.offset_path.read_text().split()
            return int(seq), int(at)
        except (OSError, ValueError):
            return 0, 0

    def _save_offset(self) -> None:
        partial = self.offset_path.with_suffix(".partial")
        partial.write_text(f"{self.read_seq} {self.read_at}\n")
        partial.replace(self.offset_path)  # atomic: a crash leaves the old offset or the new one

    def stats(self) -> dict[str, int]:
        """What /healthz and /metrics report: records waiting, and counters since the process started."""
        if self.lock is None:
            return {"backlog": self.backlog, "spool_bytes": 0, **self.counts}
        spool_bytes = sum(self._segment(s).stat().st_size for s in self._segments()) - self.read_at
        backlog, spool_bytes = self.backlog, max(0, spool_bytes)
        for orphan in self.adopted:
            backlog += orphan.backlog
            spool_bytes += orphan.stats()["spool_bytes"]
        return {"backlog": backlog, "spool_bytes": spool_bytes, **self.counts}

    def close(self) -> None:
        if self.lock is None:
            return
        for orphan in self.adopted:  # unshipped records stay in its files for whoever adopts it next
            orphan._release()
        self.adopted = []
        self.sync()
        self.writer.close()
        self.lock.close()
        self.lock = None


def _claim_slot(directory: Path) -> tuple[int, IO[str]]:
    """The first slot no live process holds (the lock goes with the process, however it ends)."""
    slot = 0
    while True:
        lock = _try_lock(directory, slot)
        if lock is not None:
            return slot, lock
        slot += 1


def _try_lock(directory: Path, slot: int) -> IO[str] | None:
    """The slot's lock, if no live process holds it."""
    lock = (directory / f"usage-{slot}.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def _spooled_slots(directory: Path) -> set[int]:
    """Every slot with a spool segment on disk."""
    return {int(m.group(1)) for p in directory.glob("usage-*-*.spool") if (m := _SEGMENT.fullmatch(p.name))}


def _refused_index(reason: str, size: int) -> int | None:
    """Which record the control plane named in its refusal ("records[3]: ..."), if it did."""
    found = _INDEX.search(reason)
    index = int(found.group(1)) if found else None
    return index if index is not None and index < size else None
