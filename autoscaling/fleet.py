"""A deployment's regions as one fleet: growth placed where there is room, cheapest first, and spilled to
another compliant region when none is left; shrinking takes the most expensive replicas first.

Pure: the caller passes what each region wants (``algorithm.decide``), what fits, and the prices. A
region's overflow regions (added by an earlier spill) share its traffic (the route table puts them in
its tier), so the group is sized as one: its net change is placed, not each region's own.
"""

import math
from dataclasses import dataclass
from decimal import Decimal

UNPRICED = Decimal("Infinity")  # a region with no price in the catalog is the last resort


@dataclass(frozen=True)
class Member:
    """One region of a group: its replicas now, what its own decision wants, its bounds, what fits."""

    code: str
    current: int
    wanted: int
    floor: int  # the policy's min (an overflow region's is 0)
    ceiling: int  # the policy's max
    room: int  # replicas more that fit now (GPUs free in the pool)
    price: Decimal = UNPRICED


@dataclass(frozen=True)
class Option:
    """A compliant region the deployment is not in yet, with the replicas that fit there."""

    code: str
    room: int
    price: Decimal = UNPRICED


@dataclass(frozen=True)
class Plan:
    replicas: dict[str, int]  # only the regions whose replicas change (new regions included)
    spilled_to: str = ""  # the region added, if any
    limited: str = ""  # why the group could not grow as far as it wanted ("" when it could)


def _by_price(members: list[Member]) -> list[Member]:
    return sorted(members, key=lambda m: (m.price, m.code))


def plan(members: list[Member], quota_room: int | None, options: list[Option]) -> Plan:
    """Place the group's net change. ``quota_room``: replicas more the tenant's GPU quota allows (None: no
    quota); ``options``: where to spill, any order (the cheapest with room is taken)."""
    net = sum(m.wanted for m in members) - sum(m.current for m in members)
    if net < 0:
        return Plan(_shrink(members, -net))
    if net == 0:
        return Plan({})
    allowed = net if quota_room is None else min(net, max(0, quota_room))
    grown, left = _grow(members, allowed)
    spilled = ""
    for option in sorted(options, key=lambda o: (o.price, o.code)):
        if left and option.room > 0:
            take = min(left, option.room)
            grown[option.code], left, spilled = take, left - take, option.code
            break
    short = left + (net - allowed)
    limited = ""
    if short:
        why = "the tenant's GPU quota" if net > allowed else "no GPUs free in any compliant region"
        limited = f"capacity-limited: {short} replica(s) more wanted, {why}"
    return Plan(grown, spilled, limited)


def _grow(members: list[Member], count: int) -> tuple[dict[str, int], int]:
    """Add ``count`` replicas, cheapest region with room first; returns the new counts and what is left."""
    replicas = {}
    for member in _by_price(members):
        take = min(count, member.room, member.ceiling - member.current)
        if take > 0:
            replicas[member.code], count = member.current + take, count - take
    return replicas, count


def _shrink(members: list[Member], count: int) -> dict[str, int]:
    """Remove ``count`` replicas, most expensive region first, none below its floor."""
    replicas = {}
    for member in reversed(_by_price(members)):
        take = min(count, member.current - member.floor)
        if take > 0:
            replicas[member.code], count = member.current - take, count - take
    return replicas


def fits(free_gpus: int, gpus_per_replica: int) -> int:
    return max(0, math.floor(free_gpus / gpus_per_replica))
