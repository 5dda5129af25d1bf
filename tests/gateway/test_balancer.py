"""Choosing an endpoint inside the gateway: tiers, weights, ejection, session affinity."""

from collections import Counter

from gateway.balancer import candidates, pick
from gateway.breakers import Breakers


def endpoints() -> list[dict]:
    return [
        {"url": "http://a", "priority": 0, "weight": 90},
        {"url": "http://b", "priority": 0, "weight": 10},
        {"url": "http://c", "priority": 1, "weight": 100},
    ]


def test_the_lowest_tier_serves_weighted_and_the_next_only_when_it_is_gone():
    ejections = Breakers(30)
    tier = candidates(endpoints(), ejections, set())
    assert {e["url"] for e in tier} == {"http://a", "http://b"}
    counts = Counter(pick(tier, None)["url"] for _ in range(5000))
    assert 0.85 < counts["http://a"] / 5000 < 0.95  # 90:10
    ejections.failure("http://a")
    assert [e["url"] for e in candidates(endpoints(), ejections, {"http://b"})] == ["http://c"]
    # Everything ejected or tried: the untried ones are still attempted rather than refusing.
    ejections.failure("http://c")
    assert [e["url"] for e in candidates(endpoints(), ejections, {"http://b"})] == ["http://a"]


def test_a_session_sticks_to_one_engine_and_sessions_spread():
    tier = candidates(endpoints(), Breakers(30), set())
    assert len({pick(tier, "session-42")["url"] for _ in range(50)}) == 1
    assert len({pick(tier, f"session-{n}")["url"] for n in range(200)}) == 2
