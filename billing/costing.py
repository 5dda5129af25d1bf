"""Pricing and attribution: pure functions over segments, prices and usage, in Decimal, to the cent.

- GPU cost: each capacity segment is cut at hour boundaries and at price changes; each piece is priced
  with the price in force at its start (``gpus × seconds / 3600 × hourly price``).
- Attribution per (deployment, hour): a dedicated deployment's cost goes to its owner. A shared one is
  split over the tenants that used it by their share of weighted tokens (prompt tokens count
  ``prompt_weight`` of a completion token), scaled by utilization; the unused share is idle cost (platform
  overhead), never spread over tenants.
- Evaluation capacity (a shadow candidate's GPUs) is the platform's ``EVALUATION`` cost, never a tenant's.
- Pipeline stages: a tenant's rounded cents of a deployment-hour are split over the (pipeline, stage) pairs
  its weighted tokens came from, by the same weighing, to the cent: the stages add up to the tenant's cents.
- Conservation: for every (region, hour) the attributed cents plus the idle and evaluation cents equal the
  total cents; rounding remainders go to the largest fractional parts, ties by tenant name (deterministic).
"""

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")
HOUR = timedelta(hours=1)
IDLE = ""  # the tenant key of idle cost
EVALUATION = "(evaluation)"  # the tenant key of rollouts' evaluation cost (never a slug: no parentheses)
Stage = tuple[str, str]  # (pipeline version, stage name) of a usage record
NO_STAGE: Stage = ("", "")  # cost outside any pipeline: direct requests, idle, evaluation


@dataclass(frozen=True)
class Segment:
    key: int  # what the costs are bucketed by (the report uses the capacity segment's id)
    region: str
    gpu_type: str
    pricing_model: str
    gpus: int
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Price:
    region: str
    gpu_type: str
    pricing_model: str
    hourly: Decimal
    effective_from: datetime


class PriceBook:
    """Prices with history: ``at(key, when)`` is the price in force at ``when`` (None: not priced)."""

    def __init__(self, prices: Iterable[Price]):
        self.history: dict[tuple[str, str, str], list[Price]] = defaultdict(list)
        for price in sorted(prices, key=lambda p: p.effective_from):
            self.history[(price.region, price.gpu_type, price.pricing_model)].append(price)

    def at(self, key: tuple[str, str, str], when: datetime) -> Price | None:
        found = self.history.get(key, [])
        index = bisect.bisect_right([p.effective_from for p in found], when) - 1
        return found[index] if index >= 0 else None

    def changes(self, key: tuple[str, str, str], start: datetime, end: datetime) -> list[datetime]:
        return [p.effective_from for p in self.history.get(key, []) if start < p.effective_from < end]


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def segment_costs(
    segments: Iterable[Segment], prices: PriceBook, start: datetime, end: datetime
) -> dict[tuple[int, str, datetime], tuple[Decimal, Decimal]]:
    """{(segment key, region, hour): (GPU-hours, cost)} within [start, end), unrounded."""
    found: dict[tuple[int, str, datetime], tuple[Decimal, Decimal]] = {}
    for segment in segments:
        key = (segment.region, segment.gpu_type, segment.pricing_model)
        lo, hi = max(segment.start, start), min(segment.end, end)
        cuts = {lo, hi, *prices.changes(key, lo, hi)}
        hour = hour_of(lo) + HOUR
        while hour < hi:
            cuts.add(hour)
            hour += HOUR
        points = sorted(cuts)
        for left, right in itertools.pairwise(points):
            price = prices.at(key, left)
            gpu_hours = Decimal(segment.gpus) * Decimal((right - left).total_seconds()) / Decimal(3600)
            cost = gpu_hours * price.hourly if price else Decimal(0)
            bucket = (segment.key, segment.region, hour_of(left))
            hours, total = found.get(bucket, (Decimal(0), Decimal(0)))
            found[bucket] = (hours + gpu_hours, total + cost)
    return found


def to_cents(shares: dict[str, Decimal], total: Decimal) -> dict[str, Decimal]:
    """Round shares to cents so they sum to ``total`` rounded to cents (largest remainder)."""
    target = total.quantize(CENT, rounding=ROUND_HALF_EVEN)
    floors = {k: (v / CENT).to_integral_value(rounding="ROUND_FLOOR") * CENT for k, v in shares.items()}
    left = int(((target - sum(floors.values(), Decimal(0))) / CENT).to_integral_value())
    order = sorted(shares, key=lambda k: (-(shares[k] - floors[k]), k))
    for key in order[: max(left, 0)]:
        floors[key] += CENT
    return floors


def attribute(
    cost: Decimal,
    owner: str,
    shared: bool,
    tokens: dict[str, tuple[int, int]],
    capacity_tokens: Decimal,
    prompt_weight: Decimal,
) -> dict[str, Decimal]:
    """One deployment-hour's cost by tenant (``IDLE`` for the unused share), unrounded, summing to the cost.

    ``tokens``: tenant → (prompt, completion). ``capacity_tokens``: weighted tokens the GPUs could have
    served in the hour (utilization = used / capacity, at most 1).
    """
    if not shared:
        return {owner: cost}
    weighted = {t: prompt_weight * p + c for t, (p, c) in tokens.items() if prompt_weight * p + c > 0}
    used = sum(weighted.values(), Decimal(0))
    utilization = (
        min(Decimal(1), used / capacity_tokens) if capacity_tokens > 0 else Decimal(1 if used else 0)
    )
    shares = {t: cost * utilization * w / used for t, w in weighted.items()} if used else {}
    shares[IDLE] = cost - sum(shares.values(), Decimal(0))
    return shares


def round_region_hour(
    shares: dict[tuple[int, str], Decimal],
) -> dict[tuple[int, str], Decimal]:
    """Round one (region, hour)'s (deployment, tenant) shares to cents together, so that attributed plus
    idle equals the region-hour's total to the cent."""
    total = sum(shares.values(), Decimal(0))
    keyed = {f"{d:012d}|{t}": v for (d, t), v in shares.items()}
    rounded = to_cents(keyed, total)
    return {(int(k.split("|", 1)[0]), k.split("|", 1)[1]): v for k, v in rounded.items()}


def stage_shares(
    cents: Decimal, gpu_hours: Decimal, weighted: dict[Stage, Decimal]
) -> dict[Stage, tuple[Decimal, Decimal]]:
    """A tenant's cents and GPU-hours of one deployment-hour by (pipeline, stage), in proportion to the
    weighted tokens each pair used: cents to the cent and adding up to ``cents`` exactly (largest
    remainder, ties by name), GPU-hours unrounded and adding up exactly. Without weighted tokens (idle,
    evaluation, an owner's hour nobody used) it all stays ``NO_STAGE``."""
    used = {stage: w for stage, w in weighted.items() if w > 0}
    if not used:
        return {NO_STAGE: (cents, gpu_hours)}
    # PostgreSQL text never holds NUL, so the joined name cannot collide (to_cents ties break by name).
    names = {"\0".join(stage): stage for stage in used}
    rounded = to_cents(_spread(cents, used, names), cents)
    hours = _spread(gpu_hours, used, names)
    return {stage: (rounded[name], hours[name]) for name, stage in names.items()}


def _spread(amount: Decimal, weights: dict[Stage, Decimal], names: dict[str, Stage]) -> dict[str, Decimal]:
    """``amount`` over the weights in proportion, unrounded; the last part takes what division left over,
    so the parts add up to ``amount`` exactly, not to within Decimal's precision."""
    total = sum(weights.values(), Decimal(0))
    parts = {name: amount * weights[stage] / total for name, stage in names.items()}
    last = next(reversed(parts))
    parts[last] = amount - sum((v for name, v in parts.items() if name != last), Decimal(0))
    return parts
