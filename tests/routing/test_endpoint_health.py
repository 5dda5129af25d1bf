"""Endpoint health is a state machine: each change is a compare-and-set written together with its timeline
event, so a prober that read a state someone else has since changed overwrites nothing and records
nothing."""

import pytest

from core.errors import InvalidTransition
from regions.models import Region
from routing import services
from routing.choices import Health, RoutingEventKind
from routing.models import EndpointHealth, RoutingEvent

URL = "http://127.0.0.1:1/engine"


@pytest.fixture
def region(db: None) -> Region:
    return Region.objects.create(
        code="eu-west-1", name="EU West", provider="local", jurisdiction="EU", driver="process"
    )


def test_two_failures_eject_and_three_successes_restore_each_with_one_event(region: Region) -> None:
    results = [False, False, True, True, True]
    changed = [services.record_health(URL, region, ok, "" if ok else "refused", 1.0, {}) for ok in results]
    assert changed == [False, True, False, False, True]
    events = RoutingEvent.objects.order_by("at", "pk")
    assert [(e.kind, e.from_region, e.message) for e in events] == [
        (RoutingEventKind.UNHEALTHY, "eu-west-1", f"{URL} is unhealthy (refused)"),
        (RoutingEventKind.HEALTHY, "eu-west-1", f"{URL} is healthy"),
    ]
    seen = EndpointHealth.objects.get(url=URL)
    assert (seen.state, seen.failures, seen.successes, seen.changed_at) == (
        Health.HEALTHY,
        0,
        3,
        seen.checked_at,
    )


def test_a_stale_transition_overwrites_nothing_and_records_nothing(region: Region) -> None:
    stale = EndpointHealth.objects.create(url=URL, region=region, failures=1)  # read while healthy
    # Another prober ejects it first.
    EndpointHealth.objects.filter(pk=stale.pk).update(state=Health.UNHEALTHY, last_error="theirs")
    with pytest.raises(InvalidTransition):
        services.endpoint_health_transition(
            stale, Health.UNHEALTHY, region=region, failures=2, last_error="mine"
        )
    row = EndpointHealth.objects.get(pk=stale.pk)
    assert (row.state, row.failures, row.last_error) == (Health.UNHEALTHY, 1, "theirs")
    assert not RoutingEvent.objects.exists()


def test_a_probe_that_lost_the_race_reports_no_change_and_records_nothing(
    region: Region, monkeypatch: pytest.MonkeyPatch
) -> None:
    EndpointHealth.objects.create(url=URL, region=region, failures=1)
    read = EndpointHealth.objects.get_or_create

    def read_then_lose_the_race(**kwargs):  # type: ignore[no-untyped-def]
        found = read(**kwargs)  # this prober reads "healthy, one failure" ...
        EndpointHealth.objects.filter(url=URL).update(state=Health.UNHEALTHY, last_error="theirs")
        return found  # ... and another one ejects it before this one writes

    monkeypatch.setattr(EndpointHealth.objects, "get_or_create", read_then_lose_the_race)
    assert services.record_health(URL, region, False, "mine", None, {}) is False
    row = EndpointHealth.objects.get(url=URL)
    assert (row.state, row.last_error) == (Health.UNHEALTHY, "theirs")
    assert not RoutingEvent.objects.exists()


def test_the_state_and_its_event_are_written_together(
    region: Region, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = EndpointHealth.objects.create(url=URL, region=region, failures=1)

    def refuse(**kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the timeline is unavailable")

    monkeypatch.setattr(RoutingEvent.objects, "create", refuse)
    with pytest.raises(RuntimeError):
        services.endpoint_health_transition(seen, Health.UNHEALTHY, region=region, failures=2)
    assert EndpointHealth.objects.get(pk=seen.pk).state == Health.HEALTHY


def test_a_move_the_state_machine_does_not_allow_is_refused(region: Region) -> None:
    seen = EndpointHealth.objects.create(url=URL, region=region)
    with pytest.raises(InvalidTransition):
        services.endpoint_health_transition(seen, Health.HEALTHY, region=region)
    assert not RoutingEvent.objects.exists()
