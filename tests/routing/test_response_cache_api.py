"""Opting in to the response cache through the API: a tenant's own members only (another tenant's slug is
404), strict input, audited, and in the next route table as the routes' ``cache``."""

from dataclasses import replace

from hypothesis import given

from core.models import AuditEvent
from routing import selectors
from routing.models import ResponseCachePolicy
from routing.routes import route_table
from tests.support.routes import worlds

URL = "/api/v1/routing/response-cache/"


def test_a_tenant_member_opts_in_changes_and_opts_out(world, api):
    alice, dave = api(world.alice), api(world.dave)
    assert alice.put(URL + "acme/chat/", {"ttl_seconds": 60}, format="json").status_code == 200
    changed = dave.put(URL + "acme/chat/", {"ttl_seconds": 600}, format="json")  # a developer may too
    assert changed.status_code == 200 and changed.json()["ttl_seconds"] == 600
    listed = alice.get(URL).json()
    assert [(r["tenant"], r["model_name"], r["ttl_seconds"]) for r in listed] == [("acme", "chat", 600)]
    policy = next(p for p in selectors.policies() if p.slug == "acme")
    assert policy.response_cache == {"chat": 600}
    assert alice.delete(URL + "acme/chat/").status_code == 204
    assert alice.delete(URL + "acme/chat/").status_code == 404
    actions = list(
        AuditEvent.objects.filter(action__startswith="response_cache").values_list("action", flat=True)
    )
    assert sorted(actions) == ["response_cache.cleared", "response_cache.set", "response_cache.set"]


def test_another_tenant_neither_sees_nor_sets_nor_clears_it(world, api):
    api(world.alice).put(URL + "acme/chat/", {"ttl_seconds": 60}, format="json")
    bob = api(world.bob)
    assert bob.get(URL).json() == []
    for call in (
        bob.put(URL + "acme/chat/", {"ttl_seconds": 5}, format="json"),
        bob.delete(URL + "acme/chat/"),
    ):
        assert call.status_code == 404 and call.json()["error"]["code"] == "not_found"
    assert ResponseCachePolicy.objects.get().ttl_seconds == 60
    viewer = api(world.vera).put(URL + "acme/chat/", {"ttl_seconds": 5}, format="json")
    assert viewer.status_code == 403  # a member who may not change deployments


def test_bad_input_is_a_400_and_writes_nothing(world, api):
    alice = api(world.alice)
    for body in (
        {"ttl_seconds": "60"},
        {"ttl_seconds": 60.0},
        {"ttl_seconds": True},
        {"ttl_seconds": 0},
        {"ttl_seconds": 10**9},
        {"ttl_seconds": 60, "extra": 1},
        {},
        {"ttl_seconds": [[[[[[60]]]]]]},
    ):
        answer = alice.put(URL + "acme/chat/", body, format="json")
        assert answer.status_code == 400 and "error" in answer.json(), body
    for name in ("ch%00at", "x" * 41, "a.b"):
        assert alice.put(URL + f"acme/{name}/", {"ttl_seconds": 60}, format="json").status_code == 400, name
    assert not ResponseCachePolicy.objects.exists()


@given(worlds())
def test_answers_are_cached_only_in_a_jurisdiction_the_tenant_and_the_version_allow(world):  # type: ignore[no-untyped-def]
    tenants, placements = world
    tenants = [replace(t, response_cache={"chat": 60}) for t in tenants]
    placements = [replace(p, production=True) for p in placements]
    table = route_table(tenants, placements)
    for tenant in tenants:
        for entry in table[tenant.slug]["models"].values():
            for place in entry["cache"]["places"]:
                assert place["jurisdiction"] in tenant.residency
                mine = [
                    p
                    for p in placements
                    if p.tenant == tenant.slug and p.jurisdiction == place["jurisdiction"]
                ]
                assert any(place["jurisdiction"] in p.allowed_jurisdictions for p in mine)


def test_the_routing_page_switches_a_routes_cache_for_its_own_tenants_only(world, client):
    page = "/routing/response-cache/"
    client.force_login(world.alice)
    on = client.post(
        page, {"tenant": "acme", "model": "chat", "ttl_seconds": "120", "action": "set"}, follow=True
    )
    assert "acme/chat: deterministic requests cached for 120 s." in on.content.decode()
    assert ResponseCachePolicy.objects.get().ttl_seconds == 120
    for bad in ({"ttl_seconds": "0"}, {"ttl_seconds": "abc"}, {"ttl_seconds": "1e9"}, {"action": "drop"}):
        answer = client.post(
            page, {"tenant": "acme", "model": "chat", "ttl_seconds": "60", "action": "set", **bad}
        )
        assert answer.status_code == 302, bad
        assert ResponseCachePolicy.objects.get().ttl_seconds == 120  # nothing written
    named = client.post(
        page, {"tenant": "acme", "model": "a.b", "ttl_seconds": "60", "action": "set"}, follow=True
    )
    assert named.status_code == 200 and "deployment&#x27;s name" in named.content.decode()
    nul = {"tenant": "acme", "model": "a\x00b", "ttl_seconds": "60", "action": "set"}
    assert client.post(page, nul).status_code == 400  # refused before any view (NUL in a form)

    client.force_login(world.bob)  # another tenant: as if acme did not exist
    other = client.post(page, {"tenant": "acme", "model": "chat", "action": "clear"})
    assert other.status_code == 404 and ResponseCachePolicy.objects.exists()
    client.force_login(world.vera)  # acme's viewer: may look, not change
    assert client.post(page, {"tenant": "acme", "model": "chat", "action": "clear"}).status_code == 403

    client.force_login(world.alice)
    off = client.post(page, {"tenant": "acme", "model": "chat", "action": "clear"}, follow=True)
    assert "response cache off" in off.content.decode() and not ResponseCachePolicy.objects.exists()
    assert client.get(page).status_code == 405
