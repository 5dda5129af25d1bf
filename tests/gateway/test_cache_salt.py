"""Shared deployments serve every tenant with prefix caching on: each tenant's requests carry its own
``cache_salt`` (which no other tenant can compute or choose), so no tenant can time another's prefixes."""

import pytest

from tests.support.gateway_harness import GatewayWorld


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def salts_seen(gw) -> list[str | None]:  # type: ignore[no-untyped-def]
    return [seen["body"].get("cache_salt") for seen in gw.engine.seen]


def test_each_tenant_gets_its_own_salt_on_a_shared_deployment(gw):
    for tenant in ("acme", "globex", "acme", "globex"):
        assert gw.chat(tenant=tenant, model="shared").status == 200
    acme, globex, acme_again, globex_again = salts_seen(gw)
    assert acme and globex and acme != globex
    assert (acme, globex) == (acme_again, globex_again)  # stable: the tenant's own prefixes stay cached
    assert acme == gw.control.table["cache_salts"]["acme"]


def test_a_client_salt_cannot_pick_another_tenants_namespace(gw):
    theirs = gw.control.table["cache_salts"]["globex"]
    assert gw.chat(tenant="globex", model="shared").status == 200
    for chosen in (theirs, "globex", "", None):
        extra = {} if chosen is None else {"cache_salt": chosen}
        answer = gw.chat(tenant="acme", model="shared", **extra)
        assert answer.status == (400 if chosen == "" else 200)
    sent = salts_seen(gw)
    assert sent[0] == theirs and theirs not in sent[1:]
    mine = gw.control.table["cache_salts"]["acme"]
    assert all(salt.startswith(mine) for salt in sent[1:])  # a client salt only subdivides acme's own


def test_a_dedicated_deployment_keeps_the_clients_salt(gw):
    assert gw.chat(model="chat").status == 200
    assert gw.chat(model="chat", cache_salt="per-user-7").status == 200
    assert salts_seen(gw) == [None, "per-user-7"]


def test_a_table_without_salts_still_isolates_tenants(gw):
    del gw.control.table["cache_salts"]
    for tenant in ("acme", "globex"):
        assert gw.chat(tenant=tenant, model="shared").status == 200
    acme, globex = salts_seen(gw)
    assert acme and globex and acme != globex and "acme" not in acme
