"""The tenant page's secrets: another tenant's secrets are neither listed nor writable, a viewer sees names
only, and a bad value is a message on the page, nothing written."""

from core.models import TenantSecret
from core.services.secrets import secret_value


def test_another_tenant_and_a_viewer_cannot_write_and_a_bad_value_is_a_message(world, client):
    client.force_login(world.alice)
    stored = client.post("/tenants/acme/secrets/", {"name": "k", "value": "v-1"}, follow=True)
    assert (
        "Secret acme/k stored (revision 1)." in stored.content.decode() and secret_value("acme", "k") == "v-1"
    )
    bad = client.post(
        "/tenants/acme/secrets/",
        {"name": "k", "value": "two words"},
        follow=True,
        HTTP_REFERER="/tenants/acme/",
    )
    assert "visible ASCII characters" in bad.content.decode() and secret_value("acme", "k") == "v-1"
    client.force_login(world.bob)
    assert client.post("/tenants/acme/secrets/", {"name": "k", "value": "taken"}).status_code == 404
    assert client.post("/tenants/acme/secrets/k/delete/").status_code == 404
    page = client.get("/tenants/globex/").content.decode()
    assert ">k<" not in page  # acme's secret is not on globex's page
    client.force_login(world.vera)  # acme's viewer
    page = client.get("/tenants/acme/").content.decode()
    assert 'class="mono">k<' in page and "Store or replace" not in page
    assert client.post("/tenants/acme/secrets/", {"name": "k", "value": "viewer"}).status_code == 403
    assert client.post("/tenants/acme/secrets/k/delete/").status_code == 403
    assert TenantSecret.objects.get().revision == 1 and secret_value("acme", "k") == "v-1"
