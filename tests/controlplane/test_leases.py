"""Two of every loop can run: a database lease makes exactly one routing loop and one beat active, and a
standby takes over when the active one is killed."""

import os
import re
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.beat import LEASE_SECONDS as BEAT_LEASE_SECONDS
from core.services.leases import lease_hold, lease_holder, lease_release
from routing import services
from routing.health import LEASE_SECONDS as ROUTER_LEASE_SECONDS
from routing.models import RouteTable
from tests.support.processes import child_env, stop_all, wait_for

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_a_lease_is_one_holders_until_it_expires_or_is_released():
    assert lease_hold("loop", "a", 10, now=T0)
    assert not lease_hold("loop", "b", 10, now=T0 + timedelta(seconds=5))  # a holds it
    assert lease_hold("loop", "a", 10, now=T0 + timedelta(seconds=9))  # renewed: until T0 + 19 s
    assert not lease_hold("loop", "b", 10, now=T0 + timedelta(seconds=18))
    assert lease_hold("loop", "b", 10, now=T0 + timedelta(seconds=19))  # a stopped renewing
    assert not lease_hold("loop", "a", 10, now=T0 + timedelta(seconds=20))
    assert lease_holder("loop", now=T0 + timedelta(seconds=20)) == "b"
    lease_release("loop", "b", now=T0 + timedelta(seconds=21))
    assert lease_holder("loop", now=T0 + timedelta(seconds=21)) == ""
    assert lease_hold("loop", "a", 10, now=T0 + timedelta(seconds=21))
    assert lease_hold("other", "b", 10, now=T0)  # leases are independent


def _pid(holder: str) -> int:
    return int(re.fullmatch(r"\w+@[^:]+:(\d+):\w+", holder)[1])  # type: ignore[index]


def _start(command: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *command], env=child_env(**env), stdout=log.open("w"), stderr=subprocess.STDOUT
    )


@pytest.mark.slow
def test_of_two_routing_loops_one_routes_and_the_other_takes_over_when_it_is_killed(
    transactional_db, world, tmp_path
):
    routers = [
        _start(["-m", "django", "route", "--interval", "0.5"], tmp_path / f"router-{n}.log") for n in (1, 2)
    ]
    try:
        holder = wait_for(lambda: lease_holder("router"), timeout=30)
        active = next(p for p in routers if p.pid == _pid(holder))
        standby = next(p for p in routers if p is not active)
        wait_for(lambda: RouteTable.objects.exists(), timeout=30)
        os.kill(active.pid, signal.SIGKILL)  # no clean stop: the lease must run out
        killed_at = datetime.now(UTC)
        generation = RouteTable.objects.latest("generation").generation
        world.tenant_a.requests_per_minute = 77  # a change only an active router publishes
        world.tenant_a.save()
        wait_for(
            lambda: RouteTable.objects.filter(generation__gt=generation).exists(),
            timeout=ROUTER_LEASE_SECONDS + 15,
        )
        assert _pid(lease_holder("router")) == standby.pid
        assert (datetime.now(UTC) - killed_at).total_seconds() < ROUTER_LEASE_SECONDS + 15
        latest = RouteTable.objects.latest("generation").body["tenants"][world.tenant_a.slug]
        assert latest["limits"]["requests_per_minute"] == 77
    finally:
        stop_all(routers)
    assert services.publish() is not None


@pytest.mark.slow
def test_of_two_beats_one_sends_the_schedule_and_the_other_takes_over_when_it_is_killed(
    transactional_db, tmp_path
):
    broker = {  # a broker of this test's own: the periodic tasks it sends reach no other test's worker
        "CELERY_BROKER_URL": "filesystem://localhost//",
        "CONTROLPLANE_VAR_DIR": str(tmp_path / "var"),
        "ROLLOUT_INTERVAL_SECONDS": "1",
    }
    logs = [tmp_path / f"beat-{n}.log" for n in (1, 2)]
    beats = [
        _start(
            [
                "-m",
                "celery",
                "-A",
                "controlplane",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(tmp_path / f"schedule-{n}"),
            ],
            log,
            **broker,
        )
        for n, log in enumerate(logs)
    ]

    def sent(log: Path) -> int:
        return log.read_text().count("Sending due task advance-rollouts")

    try:
        holder = wait_for(lambda: lease_holder("beat"), timeout=60)
        active = next(n for n, p in enumerate(beats) if p.pid == _pid(holder))
        standby = 1 - active
        wait_for(lambda: sent(logs[active]) >= 3, timeout=30)
        assert sent(logs[standby]) == 0  # the schedule is sent once, not once per beat
        os.kill(beats[active].pid, signal.SIGKILL)
        wait_for(lambda: sent(logs[standby]) >= 2, timeout=BEAT_LEASE_SECONDS + 20)
        assert _pid(lease_holder("beat")) == beats[standby].pid
    finally:
        stop_all(beats)


@pytest.mark.django_db(transaction=True)
def test_a_beat_stopped_inside_a_query_still_releases_its_lease(tmp_path):
    """Celery's SIGTERM handler closes the scheduler wherever the main thread is, even inside a query on
    its connection, whose lock psycopg does not let the same thread take twice."""
    from django.db import connection

    from controlplane.beat import LEASE, LeaderScheduler
    from controlplane.celery import app

    scheduler = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
    assert lease_hold(LEASE, scheduler.holder, BEAT_LEASE_SECONDS)
    scheduler.leading = True

    def stopped_mid_query() -> None:
        connection.ensure_connection()
        try:
            with connection.connection.lock:  # as a query in flight holds it
                scheduler.close()
        finally:
            connection.close()

    stopper = threading.Thread(target=stopped_mid_query, daemon=True)
    stopper.start()
    stopper.join(20)
    assert not stopper.is_alive(), "close() waited on its own connection"
    assert lease_holder(LEASE) == ""


@pytest.mark.slow
def test_a_beat_stopped_with_sigterm_releases_its_lease_and_exits(transactional_db, tmp_path):
    env = {"CELERY_BROKER_URL": "filesystem://localhost//", "CONTROLPLANE_VAR_DIR": str(tmp_path / "var")}
    beat = ["-m", "celery", "-A", "controlplane", "beat", "-s", str(tmp_path / "schedule")]
    proc = _start(beat, tmp_path / "beat.log", **env)
    try:
        holder = wait_for(lambda: lease_holder("beat"), timeout=60)
        assert _pid(holder) == proc.pid
        proc.terminate()
        proc.wait(timeout=20)
        assert lease_holder("beat") == ""  # released: a standby takes over at its next round, not in 15 s
    finally:
        stop_all([proc])


@pytest.mark.slow
def test_a_routing_loop_stopped_with_sigterm_releases_its_lease_and_exits(transactional_db, world, tmp_path):
    router = _start(["-m", "django", "route", "--interval", "0.5"], tmp_path / "router.log")
    try:
        holder = wait_for(lambda: lease_holder("router"), timeout=30)
        assert _pid(holder) == router.pid
        router.terminate()
        assert router.wait(timeout=20) == 0
        assert lease_holder("router") == ""
    finally:
        stop_all([router])
