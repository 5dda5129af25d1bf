"""Pricing and attribution, pure: price history, hour cuts, conservation to the cent (hypothesis), a
tenant's cents split over pipeline stages."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from billing.costing import (
    IDLE,
    NO_STAGE,
    Price,
    PriceBook,
    Segment,
    attribute,
    round_region_hour,
    segment_costs,
    stage_shares,
    to_cents,
)

T0 = datetime(2026, 11, 2, 10, 30, tzinfo=UTC)


def test_each_piece_is_priced_with_the_price_in_force_then():
    prices = PriceBook(
        [
            Price("eu-west-1", "L4", "on_demand", Decimal("2.00"), T0 - timedelta(days=30)),
            Price("eu-west-1", "L4", "on_demand", Decimal("3.00"), T0 + timedelta(minutes=45)),  # 11:15
        ]
    )
    segment = Segment(1, "eu-west-1", "L4", "on_demand", 2, T0, T0 + timedelta(hours=2))  # 10:30-12:30
    costs = segment_costs([segment], prices, T0 - timedelta(days=1), T0 + timedelta(days=1))
    hour = lambda h: T0.replace(hour=h, minute=0)  # noqa: E731
    assert costs[(1, "eu-west-1", hour(10))] == (Decimal(1), Decimal("2.00"))  # 2 GPUs × 0.5 h × 2.00
    hours, cost = costs[(1, "eu-west-1", hour(11))]  # 15 min at 2.00, 45 min at 3.00
    assert hours == Decimal(2) and cost == Decimal("0.5") * 2 + Decimal("1.5") * 3
    assert costs[(1, "eu-west-1", hour(12))] == (Decimal(1), Decimal("3.00"))
    unpriced = Segment(2, "us-east-1", "L4", "on_demand", 1, T0, T0 + timedelta(hours=1))
    assert all(c == 0 for _, c in segment_costs([unpriced], prices, T0, T0 + timedelta(hours=1)).values())


def test_a_report_window_cuts_segments():
    prices = PriceBook([Price("r", "L4", "spot", Decimal("1.20"), T0 - timedelta(days=1))])
    segment = Segment(1, "r", "L4", "spot", 1, T0 - timedelta(days=3), T0 + timedelta(days=3))
    costs = segment_costs([segment], prices, T0, T0 + timedelta(hours=1))
    assert sum(c for _, c in costs.values()) == Decimal("1.20")  # only the window, only since the price


money = st.decimals(min_value=0, max_value=10_000, places=6, allow_nan=False, allow_infinity=False)
usage = st.dictionaries(
    st.sampled_from(["acme", "globex", "initech", "umbrella"]),
    st.tuples(st.integers(0, 10**7), st.integers(0, 10**7)),
    max_size=4,
)


@given(
    st.lists(
        st.tuples(money, st.booleans(), usage, st.decimals(min_value=0, max_value=10**8, places=0)),
        min_size=1,
        max_size=6,
    ),
    st.decimals(min_value=0, max_value=1, places=3),
)
def test_attributed_plus_idle_is_the_region_hours_cost_to_the_cent(deployments, prompt_weight):  # type: ignore[no-untyped-def]
    shares: dict[tuple[int, str], Decimal] = {}
    for index, (cost, shared, tokens, capacity) in enumerate(deployments):
        for tenant, share in attribute(cost, "owner", shared, tokens, capacity, prompt_weight).items():
            shares[(index, tenant)] = share
            assert share >= -Decimal("1e-20")  # nobody is paid back
        if not shared:
            assert set(attribute(cost, "owner", shared, tokens, capacity, prompt_weight)) == {"owner"}
    rounded = round_region_hour(shares)
    total = sum((cost for cost, *_ in deployments), Decimal(0))
    assert sum(rounded.values()) == total.quantize(Decimal("0.01"))
    assert all(v == v.quantize(Decimal("0.01")) for v in rounded.values())
    assert set(rounded) == set(shares)


def test_idle_is_the_unused_share_of_a_shared_deployment():
    shares = attribute(
        Decimal("10"), "platform", True, {"acme": (0, 300), "globex": (0, 100)}, Decimal(1000), Decimal(1)
    )
    assert shares == {"acme": Decimal("3"), "globex": Decimal("1"), IDLE: Decimal("6")}  # 40 % utilized


def test_rounding_remainders_are_deterministic():
    thirds = {"b": Decimal(1) / 3, "a": Decimal(1) / 3, "c": Decimal(1) / 3}
    assert to_cents(thirds, Decimal(1)) == {"a": Decimal("0.34"), "b": Decimal("0.33"), "c": Decimal("0.33")}


stage_tokens = st.dictionaries(
    st.tuples(st.sampled_from(["", "acme/rag@1.0.0", "acme/rag@2.0.0"]), st.sampled_from(["", "a", "b"])),
    st.decimals(min_value=0, max_value=10**8, places=2),
    max_size=6,
)


@given(money, money, stage_tokens)
def test_a_tenants_stages_add_up_to_its_cents_and_gpu_hours_exactly(cost, gpu_hours, weighted):  # type: ignore[no-untyped-def]
    cents = cost.quantize(Decimal("0.01"))
    split = stage_shares(cents, gpu_hours, weighted)
    assert sum(c for c, _ in split.values()) == cents
    assert sum(h for _, h in split.values()) == gpu_hours
    assert all(c == c.quantize(Decimal("0.01")) and c >= 0 for c, _ in split.values())
    assert set(split) == ({s for s, w in weighted.items() if w > 0} or {NO_STAGE})


def test_a_stage_split_rounds_by_largest_remainder():
    weighted = {("rag", "rewrite"): Decimal(100), NO_STAGE: Decimal(50)}
    split = stage_shares(Decimal("2.50"), Decimal(1), weighted)
    assert {stage: cents for stage, (cents, _) in split.items()} == {
        ("rag", "rewrite"): Decimal("1.67"),
        NO_STAGE: Decimal("0.83"),
    }
    assert stage_shares(Decimal("1.00"), Decimal(1), {("rag", "a"): Decimal(0)}) == {
        NO_STAGE: (Decimal("1.00"), Decimal(1))
    }
