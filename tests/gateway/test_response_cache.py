"""The response cache against a real Redis: what is cacheable and how a request is keyed, one tenant's
entries never answering another, a store per jurisdiction, only good answers of the release the table
names kept, purging what no route names any more, a store that is down costing a request nothing."""

import asyncio
import uuid

import pytest
import redis

from gateway import contract
from gateway.cache_store import INDEX, PREFIX, member_keys
from gateway.response_cache import (
    ResponseCache,
    deterministic,
    good_answer,
    parse_stores,
    release_of,
    request_hash,
)
from tests.support.redis import fresh_tenant, run

DIGEST = "d" * 64
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
ANSWER = [b'{"id":"x","choices":[{"index":0,"message":{"content":"hi"}}]}']


def place(jurisdiction: str = "EU", version: str = "tiny@1.0.0", digest: str = DIGEST) -> contract.CachePlace:
    return {"jurisdiction": jurisdiction, "deployment": 7, "version": version, "artifact_sha256": digest}


def route(*places: contract.CachePlace, ttl: int = 60) -> contract.Route:
    return {"endpoints": [], "preferred": "", "cache": {"ttl_seconds": ttl, "places": list(places)}}


def table(**routes: contract.Route) -> contract.RouteTable:
    """{tenant: its one route "chat"}."""
    return {"tenants": {t: {"limits": {}, "blocked": "", "models": {"chat": r}} for t, r in routes.items()}}


def endpoint(
    jurisdiction: str = "EU", digest: str = DIGEST, track: str = contract.STABLE, version: str = "tiny@1.0.0"
) -> contract.Endpoint:
    return {
        "url": "http://engine",
        "region": "eu-west-1",
        "priority": 0,
        "weight": 100,
        "deployment": 7,
        "version": version,
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
    assert request_hash("acme", "/v1/embeddings", {"input": "\ud800"})  # a lone surrogate hashes
    # Two versions with the same weights (a new chat template) are two releases: never each other's answers.
    assert release_of(7, "tiny@1.0.0", DIGEST) != release_of(7, "tiny@1.0.1", DIGEST)


def test_stores_are_named_per_jurisdiction():
    assert parse_stores("") == {}
    assert parse_stores("eu=redis://a:6379/3, US=redis://b/0") == {
        "EU": "redis://a:6379/3",
        "US": "redis://b/0",
    }
    with pytest.raises(ValueError, match="JURISDICTION=redis"):
        parse_stores("redis://a:6379/3")


def test_only_a_whole_good_answer_is_kept():
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    assert good_answer([event, b"data: [DONE]\n\n"], stream=True) is not None
    assert good_answer([event], stream=True) is None  # broke off: never half an answer
    failed = b'data: {"error":{"message":"engine died","code":500}}\n\n'  # vLLM's mid-stream failure
    assert good_answer([event, failed, b"data: [DONE]\n\n"], stream=True) is None
    assert good_answer(ANSWER, stream=False) == ANSWER[0]
    assert good_answer([b'{"data":[{"embedding":[0.1]}]}'], stream=False) is not None
    for bad in (b'{"error":{"message":"x"}}', b'{"choices":[]}', b"[]", b"not json"):
        assert good_answer([bad], stream=False) is None, bad


def test_an_answer_is_given_back_to_its_tenant_only(redis_url):
    tenant, other = fresh_tenant(), fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        cache.install(table(**{tenant: route(place()), other: route(place())}))
        mine = cache.lookup(tenant, "/v1/chat/completions", dict(CHAT), route(place()))
        theirs = cache.lookup(other, "/v1/chat/completions", dict(CHAT), route(place()))
        assert mine and theirs and await cache.get(mine) is None
        cache.put(mine, endpoint(), ANSWER, meta(), stream=False)
        await cache.close()  # waits for the write
        cache = ResponseCache({"EU": redis_url})
        hit, miss = await cache.get(mine), await cache.get(theirs)
        await cache.close()
        return hit, miss, cache.stats()

    hit, miss, stats = run(story())
    assert hit.body == ANSWER[0] and hit.meta["usage"] == {"prompt_tokens": 3}
    assert miss is None and stats["hits"] == 1 and stats["misses"] == 1


def test_concurrent_lookups_go_together_and_each_gets_its_own_answer(redis_url):
    tenants = [fresh_tenant() for _ in range(40)]

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        cache.install(table(**{t: route(place()) for t in tenants}))
        lookups = [cache.lookup(t, "/v1/embeddings", {"input": "x"}, route(place())) for t in tenants]
        for n, lookup in enumerate(lookups[::2]):  # every other tenant has an answer
            cache.put(lookup, endpoint(), [f'{{"data":[{n}]}}'.encode()], meta(), stream=False)  # type: ignore[arg-type]
        await cache.pipes["EU"].drain(timeout=5)
        sent = 0
        mget = cache.pipes["EU"].client.mget

        async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal sent
            sent += 1
            return await mget(*args, **kwargs)

        cache.pipes["EU"].client.mget = counted  # type: ignore[method-assign]
        found = await asyncio.gather(*(cache.get(lookup) for lookup in lookups))  # type: ignore[arg-type]
        await cache.close()
        return found, sent

    found, sent = run(story())
    assert [f.body if f else None for f in found[::2]] == [f'{{"data":[{n}]}}'.encode() for n in range(20)]
    assert found[1::2] == [None] * 20  # never another tenant's answer
    assert sent == 2  # forty lookups: the first at once, the 39 that queued behind it in one MGET


def test_answers_are_kept_only_for_the_release_and_place_the_table_in_force_names(redis_url):
    tenant = fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        # A US store exists, but this route's places are EU only (the tenant's residency): an answer a US
        # engine gave (it cannot, the table would not list it) is not kept, nor is a candidate's, nor one
        # of another release, nor one the table stopped naming while it was served.
        cache = ResponseCache({"EU": redis_url, "US": redis_url.rsplit("/", 1)[0] + "/3"})
        cache.install(table(**{tenant: route(place())}))
        lookup = cache.lookup(tenant, "/v1/chat/completions", dict(CHAT), route(place()))
        assert lookup is not None and lookup.places == (("EU", release_of(7, "tiny@1.0.0", DIGEST)),)
        cache.put(lookup, endpoint("US"), ANSWER, meta(), stream=False)
        cache.put(lookup, endpoint(track=contract.CANDIDATE), ANSWER, meta(), stream=False)
        cache.put(lookup, endpoint(digest="e" * 64), ANSWER, meta(), stream=False)
        cache.put(lookup, endpoint(version="tiny@1.0.1"), ANSWER, meta(), stream=False)  # same weights
        cache.put(lookup, endpoint(), None, meta(), stream=False)  # past the size limit
        cache.put(lookup, endpoint(), [b'{"error":{"message":"x"}}'], meta(), stream=False)
        cache.install(table())  # opted out (or residency narrowed) while this one was served
        cache.put(lookup, endpoint(), ANSWER, meta(), stream=False)
        await asyncio.sleep(0.1)
        found = await cache.get(lookup)
        await cache.close()
        return found, cache.stats()

    found, stats = run(story())
    assert found is None and stats["stored"] == 0 and stats["too_large"] == 1 and stats["not_kept"] == 2


def test_no_lookup_without_opt_in_a_store_or_a_deterministic_request(redis_url):
    cache = ResponseCache({"EU": redis_url})
    sampled = {**CHAT, "temperature": 0.7}
    assert (
        cache.lookup("acme", "/v1/chat/completions", dict(CHAT), {"endpoints": [], "preferred": ""}) is None
    )
    assert cache.lookup("acme", "/v1/chat/completions", sampled, route(place())) is None
    assert cache.lookup("acme", "/v1/chat/completions", dict(CHAT), route(place("CH"))) is None  # no CH store
    assert ResponseCache().lookup("acme", "/v1/chat/completions", dict(CHAT), route(place())) is None
    older = {
        "endpoints": [],
        "preferred": "",
        "cache": {"ttl_seconds": 60, "places": [{"jurisdiction": "EU"}]},
    }
    assert cache.lookup("acme", "/v1/chat/completions", dict(CHAT), older) is None  # type: ignore[arg-type]


def test_purge_deletes_from_each_store_the_entries_its_jurisdiction_no_longer_names(redis_url):
    kept, gone = fresh_tenant(), fresh_tenant()
    version = f"tiny@{uuid.uuid4().hex[:8]}"  # a release of its own: other tests' entries are not counted
    both = [place("EU", version), place("US", version)]

    async def story():  # type: ignore[no-untyped-def]
        # Two jurisdictions in one Redis database: each store's purge must keep to its own jurisdiction.
        cache = ResponseCache({"EU": redis_url, "US": redis_url})
        cache.install(table(**{kept: route(*both), gone: route(*both)}))
        for tenant in (kept, gone):
            for n in range(3):
                lookup = cache.lookup(tenant, "/v1/embeddings", {"input": str(n)}, route(*both))
                for jurisdiction in ("EU", "US"):
                    cache.put(
                        lookup, endpoint(jurisdiction, version=version), [b'{"data":[1]}'], meta(), False
                    )  # type: ignore[arg-type]
        for pipe in cache.pipes.values():
            await pipe.drain(timeout=5)
        # gone opts out; kept's residency narrows to the EU: its US entries must go too.
        cache.install(table(**{kept: route(both[0])}))
        deleted = await cache.purge()
        await cache.close()
        return deleted

    assert run(story()) >= 9  # (and whatever members earlier runs left in this database)
    store = redis.Redis.from_url(redis_url)
    release = release_of(7, version, DIGEST)
    assert len(list(store.scan_iter(match=f"{PREFIX}:EU:{release}:{kept}:*"))) == 3
    for jurisdiction, tenant in (("US", kept), ("EU", gone), ("US", gone)):
        assert not list(store.scan_iter(match=f"{PREFIX}:{jurisdiction}:{release}:{tenant}:*"))
        assert not store.sismember(INDEX, f"{jurisdiction}:{release}:{tenant}")
        assert not store.exists(member_keys(f"{jurisdiction}:{release}:{tenant}"))


def test_an_entry_not_written_by_a_gateway_is_a_miss(redis_url):
    tenant = fresh_tenant()

    async def story():  # type: ignore[no-untyped-def]
        cache = ResponseCache({"EU": redis_url})
        lookup = cache.lookup(tenant, "/v1/embeddings", {"input": "x"}, route(place()))
        assert lookup is not None
        (jurisdiction, release), *_ = lookup.places
        found = []
        for planted in (b"not json\n{}", b'{"content_type": 5}\n{}', b"[]\n{}", b"{}"):
            await cache.pipes["EU"].client.set(lookup.key(jurisdiction, release), planted, ex=60)
            found.append(await cache.get(lookup))
        await cache.close()
        return found

    assert run(story()) == [None] * 4


def test_a_store_that_fails_is_a_miss_never_a_failure_and_is_skipped_for_a_while(redis_url):
    async def story():  # type: ignore[no-untyped-def]
        down = ResponseCache({"EU": "redis://127.0.0.1:1/0"})  # nothing listens on port 1
        down.install(table(acme=route(place())))
        lookup = down.lookup("acme", "/v1/chat/completions", dict(CHAT), route(place()))
        assert lookup is not None
        found = [await down.get(lookup), await down.get(lookup)]  # the second skips the store
        down.put(lookup, endpoint(), ANSWER, meta(), stream=False)
        await down.purge()
        await down.close()
        # A bug in the client (not a Redis error) is a miss too, and queued lookups are answered.
        broken = ResponseCache({"EU": redis_url})

        async def explode(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("a bug")

        broken.pipes["EU"].client.mget = explode  # type: ignore[method-assign]
        lookups = [
            broken.lookup(t, "/v1/embeddings", {"input": "x"}, route(place())) for t in ("a", "b", "c")
        ]
        results = await asyncio.wait_for(asyncio.gather(*(broken.get(l) for l in lookups)), timeout=5)  # type: ignore[arg-type]  # noqa: E741
        await broken.close()
        return found, down.stats(), results

    found, stats, results = run(story())
    assert found == [None, None] and results == [None, None, None]
    assert stats["errors"] == 2 and stats["bypassed"] == 1 and stats["dropped"] == 1 and stats["stored"] == 0


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
    for key in store.scan_iter(match=f"{PREFIX}:EU:*:acme:*"):  # an earlier run's: same ids, same model
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
        assert len(list(store.scan_iter(match=f"{PREFIX}:EU:*:acme:*"))) == 2  # kept in the EU store

        wait_for(lambda: UsageRecord.objects.filter(tenant=world.tenant_a).count() == 5, timeout=15)
        cached = UsageRecord.objects.filter(track=contract.CACHED)
        assert cached.count() == 2 and {r.region for r in cached} == {first.headers["x-served-region"]}
        now = timezone.now()
        rows = reports.summarize(reports.build(now - timedelta(hours=1), now), ["tenant"], {"acme"})
        assert rows[0]["requests"] == 5 and rows[0]["cached_requests"] == 2

        ModelVersion.objects.filter(artifact_sha256=digest).update(status="deprecated")
        generation = services.publish().generation
        wait_for(lambda: gateway.generation() == generation, timeout=10)
        wait_for(lambda: not list(store.scan_iter(match=f"{PREFIX}:EU:*:acme:*")), timeout=10)
        after = chat(gateway, token, temperature=0)
        assert after.status_code == 200 and "x-cache" not in after.headers  # no production version: no cache
        assert gateway.health()["response_cache"]["purged"] >= 2  # with whatever earlier runs left
    finally:
        gateway.stop()
