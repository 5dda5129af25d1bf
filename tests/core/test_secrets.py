"""Tenants' secrets: stored sealed, shown never again (names and revisions only), rotated with a new
revision, audited without their values; invisible to other tenants; bad values refused whole."""

import io
import json

import pytest
from django.test import override_settings

from core.models import AuditEvent, TenantSecret
from core.services.secrets import secret_value

URL = "/api/v1/tenants/acme/secrets/"
VALUE = "sk-live-4f9a0c1e77b2d3"


def test_a_tenant_stores_rotates_lists_and_deletes_a_secret_never_seeing_it_again(world, api):
    alice = api(world.alice)
    stored = alice.put(URL + "search-key/", {"value": VALUE}, format="json")
    assert stored.status_code == 201, stored.json()
    assert stored.json()["revision"] == 1 and "value" not in stored.json()
    rotated = alice.put(URL + "search-key/", {"value": VALUE + "-2"}, format="json")
    assert rotated.status_code == 200 and rotated.json()["revision"] == 2
    listed = alice.get(URL)
    assert [(s["name"], s["revision"]) for s in listed.json()] == [("search-key", 2)]
    assert (
        VALUE not in listed.content.decode() and VALUE not in alice.get(URL + "search-key/").content.decode()
    )
    row = TenantSecret.objects.get()
    assert VALUE.encode() not in bytes(row.sealed)  # sealed, not stored in the clear
    assert secret_value("acme", "search-key") == VALUE + "-2"
    events = AuditEvent.objects.filter(action__startswith="secret.").order_by("seq")
    assert [e.action for e in events] == ["secret.created", "secret.rotated"]
    assert all(VALUE not in json.dumps([e.before, e.after]) for e in events)
    assert alice.delete(URL + "search-key/").status_code == 204
    assert alice.get(URL + "search-key/").status_code == 404 and secret_value("acme", "search-key") is None


def test_a_new_sealing_key_makes_stored_secrets_unreadable_not_wrong(world, api):
    api(world.alice).put(URL + "k/", {"value": VALUE}, format="json")
    with override_settings(TENANT_SECRETS_KEY="another-key"):
        assert secret_value("acme", "k") is None
    assert secret_value("acme", "k") == VALUE


def test_the_sealing_key_rotates_through_a_fallback_and_a_reseal(world, api, settings):
    from django.core.management import CommandError, call_command

    api(world.alice).put(URL + "k/", {"value": VALUE}, format="json")
    old_key, before = settings.TENANT_SECRETS_KEY, bytes(TenantSecret.objects.get().sealed)
    settings.TENANT_SECRETS_KEY, settings.TENANT_SECRETS_KEY_FALLBACKS = "new-key", [old_key]
    assert secret_value("acme", "k") == VALUE  # still opens, under the fallback
    out = io.StringIO()
    call_command("reseal_secrets", stdout=out)
    assert json.loads(out.getvalue()) == {"resealed": 1, "current": 0, "unreadable": 0}
    row = TenantSecret.objects.get()
    assert bytes(row.sealed) != before and row.revision == 1  # sealed anew, the same value and revision
    event = AuditEvent.objects.get(action="secret.resealed")
    assert event.tenant == world.tenant_a and VALUE not in json.dumps([event.before, event.after])
    settings.TENANT_SECRETS_KEY_FALLBACKS = []  # the old key is gone: the value opens under the new one
    assert secret_value("acme", "k") == VALUE
    call_command("reseal_secrets", stdout=out)  # again: nothing to do
    assert AuditEvent.objects.filter(action="secret.resealed").count() == 1
    settings.TENANT_SECRETS_KEY = "a-key-nobody-kept"
    with pytest.raises(CommandError, match="1 secret"):
        call_command("reseal_secrets", stdout=io.StringIO())
    assert bytes(TenantSecret.objects.get().sealed) == bytes(row.sealed)  # left as it was


def test_a_sealed_value_opens_only_for_its_own_tenant_and_name(world, api):
    api(world.alice).put(URL + "k/", {"value": VALUE}, format="json")
    api(world.bob).put("/api/v1/tenants/globex/secrets/k/", {"value": "globex-own-value"}, format="json")
    acme, globex = (
        TenantSecret.objects.get(owner=world.tenant_a),
        TenantSecret.objects.get(owner=world.tenant_b),
    )
    TenantSecret.objects.filter(pk=globex.pk).update(sealed=acme.sealed)  # a blob copied to another row
    assert secret_value("globex", "k") is None


def test_another_tenant_and_a_viewer_cannot_touch_it(world, api):
    api(world.alice).put(URL + "k/", {"value": VALUE}, format="json")
    bob = api(world.bob)
    for answer in (
        bob.get(URL),
        bob.get(URL + "k/"),
        bob.put(URL + "k/", {"value": "taken-over"}, format="json"),
        bob.delete(URL + "k/"),
    ):
        assert answer.status_code == 404, answer.json()
    vera = api(world.vera)  # a viewer reads names, never writes
    assert [s["name"] for s in vera.get(URL).json()] == ["k"]
    assert vera.put(URL + "k/", {"value": "x"}, format="json").status_code == 403
    assert vera.delete(URL + "k/").status_code == 403
    assert api(world.dave).put(URL + "dev-key/", {"value": "x1"}, format="json").status_code == 201
    assert secret_value("acme", "k") == VALUE


@pytest.mark.parametrize(
    "body",
    [
        {"value": ""},
        {"value": "has space"},
        {"value": "line\r\nX-Injected:1"},
        {"value": "trailing-newline\n"},
        {"value": "a\nb"},
        {"value": "a\rb"},
        {"value": "tab\tinside"},
        {"value": "nul\x00byte"},
        {"value": "é-not-ascii"},
        {"value": "x" * 4097},
        {"value": 12345},
        {"value": ["a"]},
        {"value": {"nested": "x"}},
        {"value": "ok", "extra": 1},
        {},
    ],
)
def test_a_bad_value_is_refused_with_the_envelope_and_nothing_is_written(world, api, body):
    refused = api(world.alice).put(URL + "k/", body, format="json")
    assert refused.status_code == 400 and "error" in refused.json(), refused.content
    assert not TenantSecret.objects.exists() and not AuditEvent.objects.filter(action__startswith="secret.")


def test_a_name_that_is_no_secret_name_is_not_found(world, api):
    for name in ("UPPER", "-dash", "a" * 64, "a.b"):
        assert api(world.alice).put(URL + name + "/", {"value": "x"}, format="json").status_code == 404


def test_if_match_replaces_or_deletes_only_the_revision_read(world, api):
    alice = api(world.alice)
    stored = alice.put(URL + "k/", {"value": "v-1"}, format="json")
    tag = stored["ETag"]
    assert alice.get(URL + "k/")["ETag"] == tag
    assert alice.put(URL + "k/", {"value": "v-2"}, format="json", HTTP_IF_MATCH=tag).status_code == 200
    stale = alice.put(URL + "k/", {"value": "v-3"}, format="json", HTTP_IF_MATCH=tag)  # revision 1 is gone
    assert stale.status_code == 412 and stale.json()["error"]["code"] == "precondition_failed"
    assert alice.delete(URL + "k/", HTTP_IF_MATCH=tag).status_code == 412
    assert (
        alice.put(URL + "k/", {"value": "v-3"}, format="json", HTTP_IF_MATCH='"bogus-1"').status_code == 412
    )
    new = alice.put(URL + "new/", {"value": "x1"}, format="json", HTTP_IF_MATCH='"1-1"')
    assert new.status_code == 412  # nothing of that name to match
    assert secret_value("acme", "k") == "v-2" and secret_value("acme", "new") is None
    current = alice.get(URL + "k/")["ETag"]
    assert alice.delete(URL + "k/", HTTP_IF_MATCH=current).status_code == 204
