"""Status listeners are told of a reconcile pass's changes at once when nothing was told for a while, then
at most once every TELL_EVERY (or ten times what the listeners took), and of the rest when a pass ends."""

import pytest

from regions import hooks
from regions.reconciler import TELL_EVERY, Telling


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def told():
    calls: list[list[str]] = []

    def listener(changes: list[hooks.StatusChange]) -> None:
        calls.append([c.after for c in changes])

    hooks.STATUS_LISTENERS.append(listener)
    yield calls
    hooks.STATUS_LISTENERS.remove(listener)


def change(after: str) -> hooks.StatusChange:
    return hooks.StatusChange(target=None, before="pending", after=after)  # type: ignore[arg-type]


def test_first_changes_are_told_at_once_then_held_until_the_interval_or_the_end(told):
    clock = Clock()
    telling = Telling(clock)
    telling.add([change("ready")])
    assert told == [["ready"]]
    clock.now += 0.1
    telling.add([change("a")])
    telling.add([change("b")])
    assert told == [["ready"]]  # held: told less than TELL_EVERY ago
    clock.now += TELL_EVERY.total_seconds()
    telling.add([change("c")])
    assert told == [["ready"], ["a", "b", "c"]]
    telling.add([change("d")])
    telling.flush()  # the pass ended
    assert told == [["ready"], ["a", "b", "c"], ["d"]]
    telling.flush()
    assert len(told) == 3  # nothing held, nothing told


def test_slow_listeners_are_told_less_often(told):
    clock = Clock()

    def slow(changes: list[hooks.StatusChange]) -> None:
        clock.now += 0.5  # a route table over a large fleet

    hooks.STATUS_LISTENERS.append(slow)
    try:
        telling = Telling(clock)
        telling.add([change("ready")])
        clock.now += 2  # past TELL_EVERY, not past ten times what the listeners took
        telling.add([change("a")])
        assert len(told) == 1
        clock.now += 3
        telling.add([change("b")])
        assert told == [["ready"], ["a", "b"]]
    finally:
        hooks.STATUS_LISTENERS.remove(slow)
