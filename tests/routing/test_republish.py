"""Republishing the route table when a region starts or stops serving: every change is in a table
computed after it, but a burst of changes (a reconcile pass bringing a fleet up) computes a handful of
tables, not one per change."""

import threading

import pytest

from routing.services import Coalesced


def test_calls_made_while_it_runs_ask_for_one_more_run_that_sees_them_all():
    coalesced, release, started = Coalesced(), threading.Event(), threading.Event()
    runs: list[int] = []
    changes = [0]

    def publish() -> None:
        runs.append(changes[0])  # what this run sees
        started.set()
        release.wait(timeout=10)

    first = threading.Thread(target=coalesced, args=(publish,))
    first.start()
    assert started.wait(timeout=10)
    for _ in range(50):  # fifty more changes while the first run computes
        changes[0] += 1
        coalesced(publish)  # returns at once: the running one will run again
    release.set()
    first.join(timeout=10)
    assert runs == [0, 50]  # two runs for 51 calls, the last seeing every change
    coalesced(publish)
    assert runs == [0, 50, 50]  # idle again: a call runs it itself


def test_a_failing_run_leaves_it_ready_for_the_next_call():
    coalesced = Coalesced()

    def fail() -> None:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError):
        coalesced(fail)
    ran: list[bool] = []
    coalesced(lambda: ran.append(True))
    assert ran == [True]
