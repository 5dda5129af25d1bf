"""A group's net change placed: growth cheapest first within each region's room and max, the rest spilled
to the cheapest compliant option with room, what is left said as capacity-limited; shrinking from the
most expensive region down to each floor. Pure."""

from decimal import Decimal

from autoscaling.fleet import UNPRICED, Member, Option, fits, plan


def member(code: str, current: int, wanted: int, price: str | None, room: int = 10, **kw: int) -> Member:
    fields = {"floor": 1, "ceiling": 10, **kw}
    return Member(code, current, wanted, room=room, price=Decimal(price) if price else UNPRICED, **fields)


def test_nothing_wanted_nothing_planned():
    assert plan([member("a", 2, 2, "1")], None, []).replicas == {}


def test_growth_goes_to_the_cheapest_region_with_room_first():
    members = [member("dear", 1, 4, "3.00"), member("cheap", 1, 1, "1.00"), member("mid", 1, 1, "2.00")]
    assert plan(members, None, []).replicas == {"cheap": 4}  # the group's +3, all where it costs least


def test_room_and_max_replicas_cap_each_region_and_the_rest_goes_to_the_next_cheapest():
    members = [
        member("cheap", 2, 2, "1.00", room=1),
        member("mid", 1, 6, "2.00", ceiling=3),
        member("dear", 1, 1, "3.00"),
    ]
    placed = plan(members, None, [])
    assert placed.replicas == {"cheap": 3, "mid": 3, "dear": 3}  # +1 (room), +2 (max), +2
    assert placed.limited == "" and placed.spilled_to == ""


def test_an_unpriced_region_is_the_last_resort():
    members = [member("unknown", 1, 3, None), member("priced", 1, 1, "9.00")]
    assert plan(members, None, []).replicas == {"priced": 3}


def test_what_does_not_fit_spills_to_the_cheapest_option_with_room():
    members = [member("home", 2, 6, "2.00", room=1)]
    options = [
        Option("dear", 8, Decimal("5.00")),
        Option("full", 0, Decimal("0.50")),
        Option("cheap", 2, Decimal("1.00")),
        Option("unpriced", 8),
    ]
    placed = plan(members, None, options)
    assert placed.replicas == {"home": 3, "cheap": 2}
    assert placed.spilled_to == "cheap"
    assert (
        placed.limited == "capacity-limited: 1 replica(s) more wanted, no GPUs free in any compliant region"
    )


def test_only_one_region_is_added_per_plan():
    placed = plan([member("home", 1, 5, "2.00", room=0)], None, [Option("a", 1, Decimal(1)), Option("b", 9)])
    assert placed.replicas == {"a": 1} and placed.spilled_to == "a"
    assert placed.limited.startswith("capacity-limited: 3 replica(s)")


def test_the_tenants_quota_caps_growth_before_placement_and_is_named():
    members = [member("home", 1, 6, "2.00")]
    placed = plan(members, 2, [Option("other", 8, Decimal(1))])
    assert placed.replicas == {"home": 3} and placed.spilled_to == ""
    assert placed.limited == "capacity-limited: 3 replica(s) more wanted, the tenant's GPU quota"
    spent = plan(members, 0, [])
    assert spent.replicas == {} and "5 replica(s) more wanted, the tenant's GPU quota" in spent.limited
    assert plan(members, -3, []).replicas == {}  # over quota already (lowered since): nothing more


def test_shrinking_takes_the_most_expensive_replicas_first_down_to_each_floor():
    members = [
        member("cheap", 3, 0, "1.00"),  # its own signals want it emptied; the group's net is placed
        member("dear", 2, 2, "3.00", floor=0),  # an overflow region: may go to zero
        member("mid", 3, 3, "2.00", floor=2),
    ]
    assert plan(members, None, []).replicas == {"dear": 0, "mid": 2}  # −3: −2 from dear, −1 from mid
    members[2] = member("mid", 3, 1, "2.00", floor=2)
    placed = plan(members, None, []).replicas  # −5: then cheap, but only down to its floor
    assert placed == {"dear": 0, "mid": 2, "cheap": 1}


def test_fits_counts_whole_replicas():
    assert fits(7, 2) == 3
    assert fits(1, 2) == 0
    assert fits(-4, 1) == 0
