"""A tenant's limits held once for every gateway process, in a real Redis: two limiters (two processes, as
far as Redis can tell) admit a tenant's limit once between them, not once each; places in flight are
freed when requests end or their lease runs out; Redis down means per-process limits, never a failure."""

import asyncio
import time

import pytest

from gateway.fleet_limits import FleetLimits, keys
from tests.support.redis import fresh_tenant, run


async def both(url: str, **options: float) -> tuple[FleetLimits, FleetLimits]:
    return FleetLimits(url, **options), FleetLimits(url, **options)


def test_two_processes_admit_a_tenants_requests_per_minute_once_between_them(redis_url):
    tenant, limits = fresh_tenant(), {"requests_per_minute": 5}

    async def story() -> list[str]:
        one, two = await both(redis_url)
        said = []
        for n in range(10):
            refused, ticket = await (one if n % 2 else two).admit(tenant, limits, f"r{n}")
            said.append(refused)
            await (one if n % 2 else two).finish(ticket, 0)
        await one.close(), await two.close()
        return said

    said = run(story())
    assert said[:5] == [""] * 5
    assert said[5:] == ["requests per minute (5)"] * 5


def test_tokens_spent_through_one_process_are_refused_by_the_other(redis_url):
    tenant, limits = fresh_tenant(), {"tokens_per_minute": 100}

    async def story() -> tuple[str, str]:
        one, two = await both(redis_url)
        refused, ticket = await one.admit(tenant, limits, "a")
        await one.finish(ticket, 150)  # the answer was longer than the minute's tokens
        after, _ = await two.admit(tenant, limits, "b")
        await one.close(), await two.close()
        return refused, after

    assert run(story()) == ("", "tokens per minute (100)")


def test_requests_in_flight_are_counted_across_processes_and_freed_when_they_end(redis_url):
    tenant, limits = fresh_tenant(), {"concurrent_requests": 2}

    async def story() -> list[str]:
        one, two = await both(redis_url)
        _, first = await one.admit(tenant, limits, "a")
        _, second = await two.admit(tenant, limits, "b")
        full, _ = await one.admit(tenant, limits, "c")
        await two.finish(second, 0)
        again, third = await one.admit(tenant, limits, "d")
        await one.finish(first, 0), await one.finish(third, 0)
        await one.close(), await two.close()
        return [full, again]

    assert run(story()) == ["requests in flight (2)", ""]


def test_a_place_held_by_a_gateway_that_died_is_free_after_its_lease(redis_url):
    tenant, limits = fresh_tenant(), {"concurrent_requests": 1}

    async def story() -> tuple[str, str]:
        dead, alive = await both(redis_url, lease_seconds=1)
        await dead.admit(tenant, limits, "a")  # never finished, never renewed: its process is gone
        full, _ = await alive.admit(tenant, limits, "b")
        await asyncio.sleep(1.5)
        freed, _ = await alive.admit(tenant, limits, "c")
        await dead.close(), await alive.close()
        return full, freed

    assert run(story()) == ("requests in flight (1)", "")


def test_a_running_request_whose_gateway_renews_it_keeps_its_place_past_the_lease(redis_url):
    tenant, limits = fresh_tenant(), {"concurrent_requests": 1}

    async def story() -> str:
        running, other = await both(redis_url, lease_seconds=2)
        await running.admit(tenant, limits, "a")
        for _ in range(8):  # 4 s, twice the lease, renewed every half second
            await asyncio.sleep(0.5)
            await running.renew_once()
        kept, _ = await other.admit(tenant, limits, "b")
        await running.close(), await other.close()
        return kept

    assert run(story()) == "requests in flight (1)"


def test_a_tenant_without_limits_costs_no_redis_call(redis_url):
    async def story() -> tuple[object, dict[str, int]]:
        limiter = FleetLimits(redis_url)
        refused, ticket = await limiter.admit(fresh_tenant(), {}, "a")
        await limiter.close()
        return (refused, ticket), limiter.stats()

    decided, stats = run(story())
    assert decided == ("", None)
    assert stats["shared_decisions"] == stats["local_decisions"] == 0


def test_redis_down_falls_back_to_this_processes_limits_without_failing_a_request():
    tenant, limits = fresh_tenant(), {"requests_per_minute": 2, "concurrent_requests": 5}

    async def story() -> tuple[list[str], dict[str, int], float]:
        limiter = FleetLimits("redis://127.0.0.1:9/0", retry_seconds=60)  # nothing listens there
        said = []
        started = time.perf_counter()
        for n in range(3):
            refused, ticket = await limiter.admit(tenant, limits, f"r{n}")
            said.append(refused)
            await limiter.finish(ticket, 0)
        await limiter.close()
        return said, limiter.stats(), time.perf_counter() - started

    said, stats, _ = run(story())
    assert said == ["", "", "requests per minute (2)"]  # this process's own bucket decides
    assert stats["redis_errors"] == 1  # tried once, then not again within retry_seconds
    assert stats["local_decisions"] == 3 and stats["redis_up"] == 0


def test_keys_of_a_tenant_share_one_cluster_slot():
    assert all("{acme}" in key for key in keys("acme"))


@pytest.mark.parametrize("tenant", ["a:b", "x}{y", "ünï"])
def test_odd_tenant_names_are_their_own_keys(redis_url, tenant):
    limits = {"requests_per_minute": 1}

    async def story() -> list[str]:
        limiter = FleetLimits(redis_url)
        name = fresh_tenant() + tenant
        said = [(await limiter.admit(name, limits, str(n)))[0] for n in range(2)]
        await limiter.close()
        return said

    assert run(story()) == ["", "requests per minute (1)"]


def test_large_limits_are_taken_in_chunks_and_the_fleet_still_admits_the_limit_once(redis_url):
    tenant, limits = fresh_tenant(), {"requests_per_minute": 300}

    async def story() -> tuple[int, dict[str, int], dict[str, int]]:
        one, two = await both(redis_url)
        admitted = 0
        for n in range(400):
            refused, ticket = await (one if n % 2 else two).admit(tenant, limits)
            admitted += not refused
            await (one if n % 2 else two).finish(ticket, 0)
        await one.close(), await two.close()
        return admitted, one.stats(), two.stats()

    admitted, one, two = run(story())
    assert admitted == 300  # no more between them, although each asked Redis only now and then
    assert one["redis_calls"] + two["redis_calls"] < 120  # chunks of 3, not a call a request


def test_a_tenant_with_a_huge_limit_costs_a_redis_call_per_chunk_not_per_request(redis_url):
    tenant = fresh_tenant()
    limits = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "concurrent_requests": 10**6}

    async def story() -> dict[str, int]:
        limiter = FleetLimits(redis_url)
        for _ in range(500):
            refused, ticket = await limiter.admit(tenant, limits)
            assert refused == ""
            await limiter.finish(ticket, 13)
        await limiter.close()
        return limiter.stats()

    stats = run(story())
    assert stats["redis_calls"] == 1 and stats["shared_decisions"] == 500


def test_requests_arriving_together_share_one_redis_exchange_and_never_exceed_the_places(redis_url):
    tenant, limits = fresh_tenant(), {"concurrent_requests": 10}
    running, peak = 0, 0

    async def one_request(limiter: FleetLimits) -> bool:
        nonlocal running, peak
        refused, ticket = await limiter.admit(tenant, limits)
        if refused:
            return False
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        await limiter.finish(ticket, 0)
        return True

    async def story() -> tuple[int, dict[bytes, bytes]]:
        one, two = await both(redis_url)
        results = await asyncio.gather(*(one_request(one if n % 2 else two) for n in range(100)))
        held = await one.redis.hgetall(keys(tenant)[2])
        await one.close(), await two.close()
        return sum(results), held

    served, held = run(story())
    assert peak <= 10 and served >= 10
    assert held == {}  # every place was given back as its request ended (a limit of 10: chunks of 1)


def test_a_huge_limit_under_a_burst_costs_one_redis_exchange(redis_url):
    tenant, limits = fresh_tenant(), {"concurrent_requests": 10**6, "requests_per_minute": 10**9}

    async def story() -> dict[str, int]:
        limiter = FleetLimits(redis_url)
        admitted = await asyncio.gather(*(limiter.admit(tenant, limits) for _ in range(64)))
        assert all(refused == "" for refused, _ in admitted)
        await limiter.close()
        return limiter.stats()

    assert run(story())["redis_calls"] == 1


def test_an_allowance_not_spent_within_a_second_is_handed_back(redis_url):
    tenant, limits = fresh_tenant(), {"requests_per_minute": 6000}  # chunks of 60

    async def story() -> tuple[float, float]:
        limiter = FleetLimits(redis_url)
        await limiter.admit(tenant, limits)  # takes 60, spends 1
        bucket = keys(tenant)[1]
        before = float(await limiter.redis.hget(bucket, "level"))
        limiter.allowances[tenant].taken_at -= 2  # two seconds later, as the process's clock sees it
        await limiter.renew_once()
        after = float(await limiter.redis.hget(bucket, "level"))
        await limiter.close()
        return before, after

    before, after = run(story())
    assert before <= 5941 and after >= 5995  # the 59 unused are back (plus a few ms of refill)


def test_far_below_every_limit_nothing_is_refused_however_requests_interleave(redis_url):
    """Allowances taken, spent by requests ending while an exchange is away, handed back: never a refusal
    that the limits do not call for (the load of bench/gateway_bench.py once drew a 'tokens' 429)."""
    tenant = fresh_tenant()
    limits = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "concurrent_requests": 10**6}

    async def one_request(limiter: FleetLimits, n: int) -> str:
        refused, ticket = await limiter.admit(tenant, limits)
        await asyncio.sleep((n % 7) / 1000)
        await limiter.finish(ticket, 10**8 if n % 50 == 0 else 13)  # some answers long enough to owe a debt
        if n % 97 == 0:
            limiter.allowances[tenant].taken_at -= 2  # an allowance left unspent past its second
        return refused

    async def story() -> list[str]:
        one, two = await both(redis_url)
        said = await asyncio.gather(*(one_request(one if n % 2 else two, n) for n in range(600)))
        await one.close(), await two.close()
        return [s for s in said if s]

    assert run(story()) == []


def test_a_place_in_use_stays_counted_however_long_its_request_runs(redis_url):
    """Refused requests grant nothing; the keys must live on through the renewals of the running one."""
    tenant, limits = fresh_tenant(), {"concurrent_requests": 1}

    async def story() -> list[str]:
        running, other = await both(redis_url, lease_seconds=1)  # the keys would expire after 3 s
        await running.admit(tenant, limits)
        said = []
        for _ in range(10):  # 5 s
            await asyncio.sleep(0.5)
            await running.renew_once()
            said.append((await other.admit(tenant, limits))[0])
        await running.close(), await other.close()
        return said

    assert set(run(story())) == {"requests in flight (1)"}
