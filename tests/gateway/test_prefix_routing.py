"""Prefix-aware endpoint choice: a prompt goes to the engine that last served its longest prefix, unless
that engine is busier than the others by more than the imbalance allowed; sessions keep their engine;
one tenant's prompts never name another's prefixes; hostile prompts cost a bounded amount of work."""

from gateway.prefix import BLOCK_CHARS, MAX_BLOCKS, PrefixIndex, prompt_blocks
from tests.support.gateway_harness import GatewayWorld, endpoint

SYSTEM = "You are a careful assistant for the billing team. " * 20  # about 1,000 characters


def chat(system: str, question: str) -> dict:  # type: ignore[type-arg]
    return {
        "model": "chat",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


def test_prompts_sharing_a_system_prompt_share_their_leading_blocks_and_tenants_never_do():
    one, two = prompt_blocks("acme", chat(SYSTEM, "first?")), prompt_blocks("acme", chat(SYSTEM, "second?"))
    shared = len(SYSTEM) // BLOCK_CHARS
    assert one[:shared] == two[:shared] and len(one) >= shared
    assert not set(prompt_blocks("globex", chat(SYSTEM, "first?"))) & set(one)
    assert prompt_blocks("acme", chat("short", "hi")) == []  # under one block: nothing to match


def test_hostile_prompts_are_bounded():
    huge = chat("x" * 10_000_000, "y")
    assert len(prompt_blocks("acme", huge)) == MAX_BLOCKS
    parts = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "z" * 600}, {"type": "image_url"}, 7]}
        ],
    }
    assert len(prompt_blocks("acme", parts)) == 2
    for odd in (
        {"model": "m", "messages": "nope"},
        {"model": "m", "messages": [None, 3, []]},
        {"model": "m", "prompt": ["a"]},
    ):
        assert prompt_blocks("acme", odd) == []
    assert prompt_blocks("acme", {"model": "m", "prompt": "\ud800" * 300})  # lone surrogates hash too


def test_the_longest_prefix_wins_unless_its_engine_is_too_busy():
    index = PrefixIndex(imbalance=2)
    tier = [endpoint("http://a"), endpoint("http://b")]
    short = prompt_blocks("acme", chat(SYSTEM, "q"))
    index.remember(short[:2], "http://a")
    index.remember(short[:3], "http://b")  # b served a longer prefix last
    assert index.prefer(tier, short, {})["url"] == "http://b"
    assert index.prefer(tier, short, {"http://b": 3, "http://a": 1})["url"] == "http://b"  # 2 more: allowed
    assert index.prefer(tier, short, {"http://b": 4, "http://a": 1}) is None  # 3 more: load wins
    assert index.prefer([endpoint("http://c")], short, {}) is None  # not in this tier
    assert index.stats()["matched"] == 2 and index.stats()["overloaded"] == 1


def test_the_index_forgets_the_least_recently_used_prefixes_first():
    index = PrefixIndex(capacity=3)
    index.remember([b"1", b"2"], "http://a")
    index.remember([b"3", b"4"], "http://b")
    assert list(index.owner) == [b"2", b"3", b"4"]


def test_requests_with_one_system_prompt_go_to_one_engine_and_sessions_keep_theirs(gw):
    engines = gw.engines(3)
    gw.serve({"endpoints": [endpoint(e.url) for e in engines], "preferred": "eu-west-1"})
    for n in range(12):
        assert gw.call("POST", "/v1/chat/completions", chat(SYSTEM, f"question {n}")).status == 200
    assert sorted(len(e.seen) for e in engines) == [0, 0, 12]
    others = [gw.call("POST", "/v1/chat/completions", chat(SYSTEM.upper(), f"q {n}")) for n in range(6)]
    assert all(a.status == 200 for a in others)
    assert max(len(e.seen) for e in engines) >= 12  # a second prompt family sticks to one engine too
    sessions = [
        gw.call("POST", "/v1/chat/completions", chat(SYSTEM, "q"), {"x-session-id": f"s{n}"})
        for n in range(30)
    ]
    assert all(a.status == 200 for a in sessions)
    assert sum(1 for e in engines if e.seen) >= 2  # sessions spread by their own key, not the prefix


def test_prefix_routing_can_be_switched_off(tmp_path):
    gw = GatewayWorld(tmp_path, prefix_routing=False)
    try:
        engines = gw.engines(3)
        gw.serve({"endpoints": [endpoint(e.url) for e in engines], "preferred": "eu-west-1"})
        for n in range(30):
            gw.call("POST", "/v1/chat/completions", chat(SYSTEM, f"question {n}"))
        assert sum(1 for e in engines if e.seen) >= 2
    finally:
        gw.close()
