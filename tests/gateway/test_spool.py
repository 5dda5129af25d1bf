"""Usage is spooled to disk: nothing is lost while the control plane is down, across gateway restarts
(even kill -9), or when the disk refuses writes; a record the control plane refuses is quarantined and
the rest ship, in order."""

import contextlib
import errno
import json
import signal
import time

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.usage
from gateway.usage import UsageShipper
from tests.support.gateway_harness import TOKENS, GatewayWorld
from tests.support.processes import wait_for


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def send(gw, count: int, start: int = 0) -> None:  # type: ignore[no-untyped-def]
    for n in range(start, start + count):
        assert gw.chat(headers={"X-Request-ID": f"c{n}"}).status == 200


def shipped(gw) -> list[str]:  # type: ignore[no-untyped-def]
    return [r["client_request_id"] for r in gw.control.records]


def restart(gw) -> None:  # type: ignore[no-untyped-def]
    """What a new process finds: the spool on disk, nothing in memory."""
    gw.gateway.usage.close()
    gw.gateway.usage = UsageShipper(gw.gateway.settings)
    gw.gateway.usage.open()


def test_an_outage_and_a_restart_lose_nothing_and_replay_in_order(gw, monkeypatch):
    monkeypatch.setattr(gateway.usage, "SEGMENT_BYTES", 2000)  # many segments
    monkeypatch.setattr(gateway.usage, "BATCH", 7)
    gw.control.down = True
    send(gw, 40)
    with pytest.raises(Exception):  # noqa: B017  (any failure: the records stay)
        gw.ship()
    assert gw.gateway.usage.stats()["backlog"] == 40
    restart(gw)
    assert gw.gateway.usage.stats()["backlog"] == 40
    send(gw, 10, start=40)
    gw.control.down = False
    assert gw.ship() == 50
    assert shipped(gw) == [f"c{n}" for n in range(50)]
    assert gw.gateway.usage.stats()["backlog"] == 0
    restart(gw)
    assert gw.ship() == 0 and len(gw.control.records) == 50  # nothing shipped twice
    assert len(list(gw.gateway.usage.dir.glob("usage-*.spool"))) <= 2  # shipped segments are deleted


def test_a_refused_record_is_quarantined_and_the_rest_ship(gw):
    gw.control.refuse = lambda record: record["client_request_id"] in ("c3", "c7")
    send(gw, 10)
    assert gw.ship() == 10
    assert shipped(gw) == [f"c{n}" for n in range(10) if n not in (3, 7)]
    quarantined = [json.loads(line) for line in gw.gateway.usage.quarantine_path.read_text().splitlines()]
    assert [q["record"]["client_request_id"] for q in quarantined] == ["c3", "c7"]
    assert "records[3]" in quarantined[0]["reason"]
    assert gw.gateway.usage.stats()["quarantined"] == 2
    send(gw, 2, start=10)
    assert gw.ship() == 2 and shipped(gw)[-2:] == ["c10", "c11"]  # the queue moves on


def test_a_refusal_that_names_no_record_is_resolved_one_by_one(gw):
    gw.control.refuse, gw.control.name_refused = (lambda r: r["client_request_id"] == "c2"), False
    send(gw, 5)
    assert gw.ship() == 5 and shipped(gw) == ["c0", "c1", "c3", "c4"]
    assert gw.gateway.usage.stats()["quarantined"] == 1


class FullDisk:
    """A spool segment on a disk with no space left."""

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def tell(self) -> int:
        return 0


def test_a_full_disk_keeps_records_in_memory_and_ships_them(gw):
    healthy, gw.gateway.usage.writer = gw.gateway.usage.writer, FullDisk()
    send(gw, 3)
    assert gw.gateway.usage.stats()["write_errors"] == 3 and len(gw.gateway.usage.memory) == 3
    assert gw.ship() == 3 and shipped(gw) == ["c0", "c1", "c2"]
    gw.gateway.usage.writer = healthy
    send(gw, 1, start=3)
    assert gw.ship() == 1 and shipped(gw)[-1] == "c3"


def test_the_spool_is_reported_on_healthz_and_metrics(gw):
    gw.control.down = True
    send(gw, 4)
    health = gw.call("GET", "/healthz", tenant=None).json()
    assert health["usage"]["backlog"] == 4 and health["usage"]["spooled"] == 4
    assert health["usage"]["spool_bytes"] > 0
    metrics = gw.call("GET", "/metrics", tenant=None)
    assert metrics.status == 200 and "gateway_usage_backlog 4\n" in metrics.body.decode()
    assert "gateway_usage_spooled_total 4\n" in metrics.body.decode()
    assert health["usage"]["shipped"] == 0

    gw.control.down = False
    assert gw.ship() == 4
    after = gw.call("GET", "/healthz", tenant=None).json()["usage"]
    assert after["shipped"] == 4 and after["backlog"] == 0
    assert "gateway_usage_shipped_total 4\n" in gw.call("GET", "/metrics", tenant=None).body.decode()


@pytest.mark.slow
def test_kill_9_during_an_outage_then_recovery_counts_every_request(tmp_path):
    from tests.support.gateway import Gateway

    world = GatewayWorld(tmp_path / "fakes")  # its engine and control plane, served to a real process
    auth = {"Authorization": f"Bearer {TOKENS['acme']}"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}

    def post(url: str, count: int) -> None:
        for _ in range(count):
            assert requests.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=10).ok

    first = Gateway(world.control.url, "gw", tmp_path / "routes.json", tmp_path / "gateway.log")
    try:
        world.control.down = True
        post(first.url, 60)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        second = Gateway(world.control.url, "gw", tmp_path / "routes.json", tmp_path / "gateway.log")
        post(second.url, 40)
        assert requests.get(f"{second.url}/healthz", timeout=2).json()["usage"]["backlog"] == 100
        time.sleep(1.5)
        assert world.control.records == []  # still down: nothing could have been shipped
        world.control.down = False
        wait_for(lambda: len(world.control.records) >= 100, timeout=20)
        time.sleep(1.5)
        ids = [r["request_id"] for r in world.control.records]
        assert len(ids) == 100 and len(set(ids)) == 100
        second.stop()
    finally:
        world.close()


def test_a_line_torn_by_a_crash_is_quarantined_and_the_rest_replayed(gw):
    gw.control.down = True
    send(gw, 3)
    gw.gateway.usage.writer.write(b'{"request_id": "torn", "ten')  # the process died mid-write
    gw.gateway.usage.writer.flush()
    restart(gw)
    send(gw, 1, start=3)
    gw.control.down = False
    assert gw.ship() == 4 and shipped(gw) == ["c0", "c1", "c2", "c3"]
    assert gw.gateway.usage.stats()["quarantined"] == 1
    assert "torn" in gw.gateway.usage.quarantine_path.read_text()


class FlakyDisk:
    """A spool writer whose write puts the first half of the data on disk, then fails (disk full)."""

    def __init__(self, real):  # type: ignore[no-untyped-def]
        self.real, self.failing = real, False

    def write(self, data: bytes) -> int:
        if self.failing:
            self.real.write(bytes(data[: len(data) // 2]))
            self.real.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(data)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.real, name)


def flaky(gw, failing: bool) -> None:  # type: ignore[no-untyped-def]
    usage = gw.gateway.usage
    if not isinstance(usage.writer, FlakyDisk):
        usage.writer = FlakyDisk(usage.writer)
    usage.writer.failing = failing
    if not failing:
        usage.sync()  # the disk is back: memory is written at the next record or sync


actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 12)),
        st.tuples(
            st.sampled_from(
                ["down", "up", "lose_replies", "restart", "ship", "refuse_next", "disk_fails", "disk_ok"]
            )
        ),
    ),
    max_size=14,
)


@pytest.mark.heavy  # a property search over 30 histories of disk and network faults
@settings(max_examples=30, deadline=None)
@given(steps=actions)
def test_whatever_happens_every_record_arrives_once_in_order_or_is_quarantined(steps):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as state:
        gw = GatewayWorld(Path(state))
        saved = gateway.usage.SEGMENT_BYTES, gateway.usage.BATCH
        gateway.usage.SEGMENT_BYTES, gateway.usage.BATCH = 1500, 5
        refused: set[str] = set()
        try:
            sent = 0
            for step in steps:
                if step[0] == "send":
                    send(gw, step[1], start=sent)
                    sent += step[1]
                elif step[0] in ("down", "up", "lose_replies"):
                    gw.control.down, gw.control.lose_replies = step[0] == "down", step[0] == "lose_replies"
                elif step[0] == "restart":
                    flaky(gw, failing=False)  # a graceful restart: memory is written first
                    restart(gw)
                elif step[0] in ("disk_fails", "disk_ok"):  # halfway writes, then a full disk
                    flaky(gw, failing=step[0] == "disk_fails")
                elif step[0] == "refuse_next":
                    refused.add(f"c{sent}")
                else:
                    with contextlib.suppress(Exception):  # down or reply lost: the records stay
                        gw.ship()
                gw.control.refuse = lambda record: record["client_request_id"] in refused
            gw.control.down = gw.control.lose_replies = False
            flaky(gw, failing=False)
            gw.ship()
            expected = [f"c{n}" for n in range(sent) if f"c{n}" not in refused]
            assert shipped(gw) == expected  # each once (the control plane dedups a re-sent batch), in order
            assert gw.gateway.usage.stats()["backlog"] == 0
            quarantined = gw.gateway.usage.quarantine_path
            lines = quarantined.read_text().splitlines() if quarantined.exists() else []
            assert {json.loads(q)["record"]["client_request_id"] for q in lines} == refused & {
                f"c{n}" for n in range(sent)
            }
        finally:
            gateway.usage.SEGMENT_BYTES, gateway.usage.BATCH = saved
            gw.close()


def test_fewer_workers_after_a_restart_still_ship_every_slots_records(gw):
    """Two workers spooled under slots 0 and 1; restarted with one worker, slot 1 is adopted and shipped."""
    gw.control.down = True
    first = gw.gateway.usage
    second = UsageShipper(gw.gateway.settings)
    second.open()  # the second worker: slot 0 is held, so it takes slot 1
    assert (first.slot, second.slot) == (0, 1)
    send(gw, 4)
    gw.gateway.usage = second
    send(gw, 3, start=4)
    gw.gateway.usage = first
    send(gw, 2, start=7)
    second.close()  # both workers stop (the second first, as it would during a shutdown)
    restart(gw)  # one worker now
    assert gw.gateway.usage.slot == 0
    assert gw.gateway.usage.stats()["backlog"] == 9
    gw.control.down = False
    assert gw.ship() == 9
    assert sorted(shipped(gw), key=lambda c: int(c[1:])) == [f"c{n}" for n in range(9)]
    assert len(set(shipped(gw))) == 9
    assert not list(gw.gateway.usage.dir.glob("usage-1-*.spool"))  # the adopted slot is emptied
    restart(gw)
    assert gw.ship() == 0 and len(gw.control.records) == 9  # nothing twice


def test_a_slot_orphaned_while_running_is_adopted_periodically(gw):
    gw.control.down = True
    other = UsageShipper(gw.gateway.settings)
    other.open()
    gw.gateway.usage, mine = other, gw.gateway.usage
    send(gw, 3)
    gw.gateway.usage = mine
    other.close()  # that worker died; this one was already running
    gw.control.down = False
    assert gw.ship() == 0  # not adopted yet
    gw.gateway.usage.adopt_orphans()
    assert gw.gateway.usage.stats()["backlog"] == 3
    assert gw.ship() == 3 and shipped(gw) == ["c0", "c1", "c2"]
    again = UsageShipper(gw.gateway.settings)
    again.open()  # the adopted slot was released once shipped: a new worker can claim it
    assert again.slot == 1
    again.close()


def test_a_write_that_fails_halfway_leaves_no_torn_line_when_the_disk_recovers(gw):
    disk = FlakyDisk(gw.gateway.usage.writer)
    gw.gateway.usage.writer = disk
    send(gw, 1)
    disk.failing = True
    send(gw, 2, start=1)  # half of the batch reached the file, then the disk filled up
    assert gw.gateway.usage.stats()["write_errors"] == 2
    disk.failing = False
    send(gw, 1, start=3)  # the disk recovered: the kept lines are written whole
    assert gw.ship() == 4
    assert shipped(gw) == ["c0", "c1", "c2", "c3"]
    assert gw.gateway.usage.stats()["quarantined"] == 0 and gw.gateway.usage.stats()["backlog"] == 0


def test_records_written_while_memory_is_being_shipped_are_not_lost(gw):
    usage = gw.gateway.usage
    healthy, usage.writer = usage.writer, FullDisk()
    send(gw, 2)
    assert len(usage.memory) == 2
    deliver, once = usage._deliver, [True]

    async def deliver_while_recording(session, lines):  # type: ignore[no-untyped-def]
        template = json.loads(lines[0])
        if once.pop() if once else False:
            usage.writer = healthy  # the disk recovers while the memory batch is in flight
            usage.record({**template, "request_id": "r2", "client_request_id": "c2"})
            usage.writer = FullDisk()  # and fails again
            usage.record({**template, "request_id": "r3", "client_request_id": "c3"})
        await deliver(session, lines)

    usage._deliver = deliver_while_recording
    gw.ship()
    usage._deliver, usage.writer = deliver, healthy
    gw.ship()
    assert sorted(shipped(gw)) == ["c0", "c1", "c2", "c3"]  # each once (the control plane dedups)
    assert usage.stats()["backlog"] == 0 and usage.memory == []


def test_the_shipping_loop_looks_for_orphaned_slots(tmp_path, monkeypatch):
    import asyncio

    monkeypatch.setattr(gateway.usage, "ADOPT_EVERY", 2)
    gw = GatewayWorld(tmp_path, usage_interval_seconds=0.01)
    try:
        gw.control.down = True
        other = UsageShipper(gw.gateway.settings)
        other.open()
        gw.gateway.usage, mine = other, gw.gateway.usage
        send(gw, 3)
        gw.gateway.usage = mine
        other.close()  # that worker died after this one started
        gw.control.down = False

        async def ship_for_a_while() -> None:
            task = asyncio.create_task(mine.ship_forever(gw.gateway.session))
            for _ in range(500):
                await asyncio.sleep(0.01)
                if len(gw.control.records) == 3 and not mine.adopted:
                    break
            task.cancel()

        gw.run(ship_for_a_while())
        assert shipped(gw) == ["c0", "c1", "c2"] and mine.adopted == []
        assert mine.stats()["backlog"] == 0
    finally:
        gw.close()
