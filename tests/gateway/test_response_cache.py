"""The response cache against a real Redis: what is cacheable and how a request is keyed, one tenant's
entries never answering another, a store per jurisdiction, purging what no route lists, a store that is
down costing a request nothing."""

import asyncio
import uuid

import pytest
import redis

from gateway import contract
from gateway.response_cache import (
    INDEX,
    PREFIX,
    ResponseCache,
    deterministic,
    live_places,
    parse_stores,
    request_hash,
    whole,
)
from tests.support.redis import fresh_tenant, run

DIGEST = "d" * 64
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def route(*places: tuple[str, str], ttl: int = 60) -> contract.Route:
    cache: contract.ResponseCache = {
        "ttl_seconds": ttl,
        "places": [{"jurisdiction": j, "artifact_sha256": d} for j, d in places],
    }
    return {"endpoints": [], "preferred": "", "cache": cache}


def endpoint(
    jurisdiction: str = "EU", digest: str = DIGEST, track: str = contract.STABLE
) -> contract.Endpoint:
    return {
        "url": "http://engine",
        "region": "eu-west-1",
        "priority": 0,
        "weight": 100,
        "deployment": 7,
        "version": "tiny@1.0.0",
        "served_model": "tiny",
        "artifact_sha256": digest,
        "shared": False,
        "jurisdiction": jurisdiction,
        "track": track,
    }


def meta() -> dict:  # type: ignore[type-arg]
    return {
        "content_type": "application/json",
        "usage": {"prompt_tokens": 3},
        "region": "eu-west-1",
        "deployment": 7,
        "version": "tiny@1.0.0",
        "artifact_sha256": DIGEST,
    }


def test_only_requests_with_one_answer_are_cacheable():
    assert deterministic("/v1/chat/completions", {"temperature": 0})
    assert deterministic("/v1/chat/completions", {"temperature": 0.0})
    assert deterministic("/v1/completions", {"temperature": 0.9, "seed": 42})
    assert deterministic("/v1/embeddings", {"input": "x"})
    assert not deterministic("/v1/chat/completions", {})  # the default temperature samples
    assert not deterministic("/v1/chat/completions", {"temperature": 0.2})
    assert not deterministic("/v1/chat/completions", {"temperature": False, "seed": True})
    assert not deterministic("/v1/chat/completions", {"temperature": "0", "seed": "1"})


def test_a_request_is_keyed_by_its_tenant_path_and_normalised_body():
    same = request_hash("acme", "/v1/chat/completions", {"temperature": 0.0, "model": "chat", "n": 1.0})
    assert same == request_hash("acme", "/v1/chat/completions", {"n": 1, "model": "chat", "temperature": 0})
    assert same != request_hash("globex", "/v1/chat/completions", {"n": 1, "model": "chat", "temperature": 0})
    assert same != request_hash("acme", "/v1/completions", {"n": 1, "model": "chat", "temperature": 0})
    assert same != request_hash("acme", "/v1/chat/completions", {"n": 1, "model": "chat", "temperature": 0.5})


def test_stores_are_named_per_jurisdiction():
    assert parse_stores("") == {}
    assert parse_stores("eu=redis://a:6379/3, US=redis://b/0") == {
        "EU": "redis://a:6379/3",
        "US": "redis://b/0",
    }
    with pytest.raises(ValueError, match="JURISDICTION=redis"):
        parse_stores("redis://a:6379/3")


def test_only_a_whole_stream_is_kept():
    assert whole([b'data: {"a":1}\n\n', b"data: [DONE]\n\n"], stream=True) is not None
    assert whole([b'data: {"a":1}\n\n'], stream=True) is None  # broke off: never half an answer
    assert whole([b'{"a":1}'], stream=False) == b'{"a":1}'


def test_the_places_kept_are_those_the_table_lists_per_tenant():
    table: contract.RouteTable = {
        "tenants": {
            "acme": {"limits": {}, "blocked": "", "models": {"chat": route(("EU", "a1")), "b": route()}},
            "globex": {"limits": {}, "blocked": "", "models": {"chat": {"endpoints": [], "preferred": ""}}},
        }
    }
    assert live_places(table) == {"a1:acme"}


def test_an_answer_is_given_back_to_its_tenant_only(redis_url):
    tenant, other = fresh_tenant(), fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        mine = cache.lookup(tenant, "/v1/chat/completions", dict(CHAT), route(("EU", DIGEST)))
        theirs = cache.lookup(other, "/v1/chat/completions", dict(CHAT), route(("EU", DIGEST)))
        assert mine and theirs and await cache.get(mine) is None
        cache.put(mine, endpoint(), [b'{"answer":', b"1}"], meta(), stream=False)
        await cache.close()  # waits for the write
        cache = ResponseCache({"EU": redis_url})
        hit, miss = await cache.get(mine), await cache.get(theirs)
        await cache.close()
        return hit, miss, cache.stats()

    hit, miss, stats = run(story())
    assert hit.body == b'{"answer":1}' and hit.meta["usage"] == {"prompt_tokens": 3}
    assert miss is None and stats["hits"] == 1 and stats["misses"] == 1


def test_concurrent_lookups_go_together_and_each_gets_its_own_answer(redis_url):
    tenants = [fresh_tenant() for _ in range(40)]

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        lookups = [cache.lookup(t, "/v1/embeddings", {"input": "x"}, route(("EU", DIGEST))) for t in tenants]
        for n, lookup in enumerate(lookups[::2]):  # every other tenant has an answer
            cache.put(lookup, endpoint(), [f'{{"n":{n}}}'.encode()], meta(), stream=False)  # type: ignore[arg-type]
        await cache.pipes["EU"].drain(timeout=5)
        sent = 0
        mget = cache.clients["EU"].mget

        async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal sent
            sent += 1
            return await mget(*args, **kwargs)

        cache.clients["EU"].mget = counted  # type: ignore[method-assign]
        found = await asyncio.gather(*(cache.get(lookup) for lookup in lookups))  # type: ignore[arg-type]
        await cache.close()
        return found, sent

    found, sent = run(story())
    assert [f.body if f else None for f in found[::2]] == [f'{{"n":{n}}}'.encode() for n in range(20)]
    assert found[1::2] == [None] * 20  # never another tenant's answer
    assert sent == 2  # forty lookups: the first at once, the 39 that queued behind it in one MGET


def test_answers_are_kept_only_where_the_route_allows_and_only_from_the_stable_production_revision(redis_url):
    tenant = fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        # A US store exists, but this route's places are EU only (the tenant's residency): an answer a US
        # engine gave (it cannot, the table would not list it) is not kept, nor is a candidate's.
        cache = ResponseCache({"EU": redis_url, "US": redis_url.rsplit("/", 1)[0] + "/3"})
        lookup = cache.lookup(tenant, "/v1/chat/completions", dict(CHAT), route(("EU", DIGEST)))
        assert lookup is not None and lookup.places == (("EU", DIGEST),)
        cache.put(lookup, endpoint("US"), [b"{}"], meta(), stream=False)
        cache.put(lookup, endpoint(track=contract.CANDIDATE), [b"{}"], meta(), stream=False)
        cache.put(lookup, endpoint(digest="e" * 64), [b"{}"], meta(), stream=False)  # not a production digest
        cache.put(lookup, endpoint(), None, meta(), stream=False)  # past the size limit
        await asyncio.sleep(0.1)
        found = await cache.get(lookup)
        await cache.close()
        return found, cache.stats()

    found, stats = run(story())
    assert found is None and stats["stored"] == 0 and stats["too_large"] == 1


def test_no_lookup_without_opt_in_a_store_or_a_deterministic_request(redis_url):
    cache = ResponseCache({"EU": redis_url})
    sampled = {**CHAT, "temperature": 0.7}
    assert (
        cache.lookup("acme", "/v1/chat/completions", dict(CHAT), {"endpoints": [], "preferred": ""}) is None
    )
    assert cache.lookup("acme", "/v1/chat/completions", sampled, route(("EU", DIGEST))) is None
    assert (
        cache.lookup("acme", "/v1/chat/completions", dict(CHAT), route(("CH", DIGEST))) is None
    )  # no CH store
    assert ResponseCache().lookup("acme", "/v1/chat/completions", dict(CHAT), route(("EU", DIGEST))) is None


def test_purge_deletes_the_entries_no_route_lists_any_more(redis_url):
    kept, gone = fresh_tenant(), fresh_tenant()
    digest = uuid.uuid4().hex * 2  # its own version: other tests' entries are purged too, but not counted

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        others = {m.decode() for m in await cache.clients["EU"].smembers(INDEX)} - {f"{digest}:{gone}"}
        for tenant in (kept, gone):
            for n in range(3):
                lookup = cache.lookup(tenant, "/v1/embeddings", {"input": str(n)}, route(("EU", digest)))
                assert lookup is not None
                cache.put(lookup, endpoint(digest=digest), [b"{}"], meta(), stream=False)
        await cache.pipes["EU"].drain(timeout=5)
        deleted = await cache._purge(cache.clients["EU"], {f"{digest}:{kept}", *others})
        await cache.close()
        return deleted

    assert run(story()) == 3
    store = redis.Redis.from_url(redis_url)
    assert len(list(store.scan_iter(match=f"{PREFIX}:{digest}:{kept}:*"))) == 3
    assert not list(store.scan_iter(match=f"{PREFIX}:{digest}:{gone}:*"))
    assert not store.sismember(INDEX, f"{digest}:{gone}")


def test_an_entry_not_written_by_a_gateway_is_a_miss(redis_url):
    tenant = fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        lookup = cache.lookup(tenant, "/v1/embeddings", {"input": "x"}, route(("EU", DIGEST)))
        assert lookup is not None
        found = []
        for planted in (b"not json\n{}", b'{"content_type": 5}\n{}', b"[]\n{}", b"{}"):
            await cache.clients["EU"].set(lookup.key(DIGEST), planted, ex=60)
            found.append(await cache.get(lookup))
        await cache.close()
        return found

    assert run(story()) == [None] * 4


def test_a_store_that_is_down_is_a_miss_never_a_failure():
    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": "redis://127.0.0.1:1/0"})  # nothing listens on port 1
        lookup = cache.lookup("acme", "/v1/chat/completions", dict(CHAT), route(("EU", DIGEST)))
        assert lookup is not None
        found = await cache.get(lookup)
        cache.put(lookup, endpoint(), [b"{}"], meta(), stream=False)
        await cache.purge(set())
        await cache.close()
        return found, cache.stats()

    found, stats = run(story())
    assert found is None and stats["errors"] == 3 and stats["stored"] == 0


def test_an_opted_in_tenant_gets_its_deterministic_answers_from_the_cache_until_the_version_leaves_production(
    world, fleet, redis_url, tmp_path
):
    from datetime import timedelta

    from django.utils import timezone

    from billing import reports
    from billing.models import UsageRecord
    from registry.models import ModelVersion
    from routing import services
    from tests.support.gateway import Gateway, chat
    from tests.support.principals import principal
    from tests.support.processes import wait_for

    digest = fleet["deployment"].version.artifact_sha256
    store = redis.Redis.from_url(redis_url)
    for key in store.scan_iter(
        match=f"{PREFIX}:{digest}:acme:*"
    ):  # an earlier run's (the model is generated alike)
        store.unlink(key)
    services.response_cache_set(
        actor=principal(world.alice), tenant=world.tenant_a, model_name="chat", ttl_seconds=300
    )
    gateway = Gateway(
        fleet["live"].url,
        fleet["gateway_token"],
        tmp_path / "routes-cache.json",
        tmp_path / "gw-cache.log",
        GATEWAY_RESPONSE_CACHE_STORES=f"EU={redis_url}",
    )
    token = fleet["tokens"]["alice"]
    try:

        def stored(count: int) -> None:  # answers are written a few ms after they are given
            wait_for(lambda: gateway.health()["response_cache"]["stored"] == count, timeout=5)

        first = chat(gateway, token, temperature=0)
        stored(1)
        again = chat(gateway, token, temperature=0)
        assert (first.status_code, first.headers["x-cache"]) == (200, "miss")
        assert (again.status_code, again.headers["x-cache"]) == (200, "hit")
        assert again.json()["id"] == first.json()["id"]  # the same answer, not the engine's next one
        assert "x-cache" not in chat(gateway, token, temperature=0.8).headers  # samples: never cached

        streamed = [chat(gateway, token, temperature=0, stream=True)]
        stored(2)
        streamed.append(chat(gateway, token, temperature=0, stream=True))
        assert [s.headers["x-cache"] for s in streamed] == ["miss", "hit"]
        assert streamed[1].text == streamed[0].text and streamed[1].text.rstrip().endswith("data: [DONE]")
        assert streamed[1].headers["content-type"].startswith("text/event-stream")
        assert len(list(store.scan_iter(match=f"{PREFIX}:{digest}:acme:*"))) == 2  # kept in the EU store

        wait_for(lambda: UsageRecord.objects.filter(tenant=world.tenant_a).count() == 5, timeout=15)
        cached = UsageRecord.objects.filter(track=contract.CACHED)
        assert cached.count() == 2 and {r.region for r in cached} == {first.headers["x-served-region"]}
        now = timezone.now()
        rows = reports.summarize(reports.build(now - timedelta(hours=1), now), ["tenant"], {"acme"})
        assert rows[0]["requests"] == 5 and rows[0]["cached_requests"] == 2

        ModelVersion.objects.filter(artifact_sha256=digest).update(status="deprecated")
        generation = services.publish().generation
        wait_for(lambda: gateway.generation() == generation, timeout=10)
        wait_for(lambda: not list(store.scan_iter(match=f"{PREFIX}:{digest}:acme:*")), timeout=10)
        after = chat(gateway, token, temperature=0)
        assert after.status_code == 200 and "x-cache" not in after.headers  # no production version: no cache
        assert gateway.health()["response_cache"]["purged"] >= 2  # with whatever earlier runs left
    finally:
        gateway.stop()
