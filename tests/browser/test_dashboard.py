"""The operator console in a real browser: sign in, walk the navigation, mint a token, find it audited."""

import pytest

from tests.support.browser import login, shot
from tests.support.factories import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NAVIGATION = [
    "Overview",
    "Registry",
    "Regions",
    "Deployments",
    "Rollouts",
    "Routing",
    "Pipelines",
    "Costs",
    "Audit",
    "Tenants",
    "Users",
    "Tokens",
]


def test_admin_walks_the_console_creates_a_token_and_finds_it_in_the_audit_log(page, world):
    login(page, "root", PASSWORD)
    shot(page, "01-overview")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator(".sidebar nav a").all_inner_texts() == NAVIGATION

    for label in NAVIGATION:
        page.click(f".sidebar nav a[data-nav='{label}']")
        assert page.locator(".sidebar nav a.active").inner_text() == label
        shot(page, f"02-nav-{label.lower()}")

    page.click(".sidebar nav a[data-nav='Tokens']")
    page.fill("#token-form input[name=name]", "release-robot")
    page.check("#token-form input[value='audit:read']")
    page.check("#token-form input[value='tenants:read']")
    page.click("#token-form button[type=submit]")
    secret = page.locator("#token-secret").inner_text()
    assert secret.startswith("cpt_")
    shot(page, "03-token-created")
    page.goto("/tokens/")  # the secret is never stored, so it cannot be shown again
    assert page.locator("#token-secret").count() == 0
    assert "release-robot" in page.locator("table").first.inner_text()
    assert secret not in page.content()

    page.click(".sidebar nav a[data-nav='Audit']")
    page.fill("input[name=action]", "token.created")
    page.click("form.filters button[type=submit]")
    row = page.locator("table.audit tbody tr").first
    assert "token.created" in row.inner_text() and "release-robot" in row.inner_text()
    assert secret not in page.content()
    shot(page, "04-audit-token-created")


def test_tenant_admin_sees_only_their_tenant_and_manages_members(page, world):
    login(page, "alice", PASSWORD)
    assert page.locator(".sidebar nav a").all_inner_texts() == NAVIGATION  # tenant admins hold audit:read
    page.click(".sidebar nav a[data-nav='Tenants']")
    assert page.locator("table tbody tr").count() == 1
    assert "globex" not in page.content()
    page.click("text=acme")
    page.fill("form.row-form input[name=username]", "bob")
    page.select_option("form.row-form select[name=role]", "viewer")
    page.click("form.row-form button:has-text('Invite or change role')")
    # bob belongs to another tenant: he is invited, not pulled in (issue 11, section 2)
    assert "bob is invited as viewer" in page.locator(".messages").inner_text()
    assert "Pending invitations" in page.content()
    shot(page, "05-tenant-members")
    page.goto("/tenants/globex/")
    assert "Not found" in page.locator("h1").inner_text()


def test_bad_tenant_input_shows_a_helpful_message(page, world):
    login(page, "root", PASSWORD)
    page.goto("/tenants/new/")
    page.fill("input[name=slug]", "Bad Slug!")
    page.fill("input[name=name]", "Bad")
    page.fill("input[name=budget_currency]", "USD")
    page.click("button[type=submit]")
    assert page.locator(".error-text").count() >= 2  # slug and residency
    shot(page, "06-tenant-form-errors")


def test_a_tenant_admin_stores_replaces_and_deletes_a_secret_never_seeing_it_again(page, world):
    login(page, "alice", PASSWORD)
    page.goto("/tenants/acme/")
    form = page.locator("#secrets form.row-form")
    form.locator("input[name=name]").fill("search-key")
    form.locator("input[name=value]").fill("sk-live-browser-1")
    form.locator("button:has-text('Store or replace')").click()
    assert "Secret acme/search-key stored (revision 1)." in page.locator(".messages").inner_text()
    assert "sk-live-browser-1" not in page.content()  # never shown, not even in the form
    form = page.locator("#secrets form.row-form")
    form.locator("input[name=name]").fill("search-key")
    form.locator("input[name=value]").fill("has a space")
    form.locator("button:has-text('Store or replace')").click()
    assert "visible ASCII characters" in page.locator(".messages").inner_text()
    form = page.locator("#secrets form.row-form")
    form.locator("input[name=name]").fill("search-key")
    form.locator("input[name=value]").fill("sk-live-browser-2")
    form.locator("button:has-text('Store or replace')").click()
    assert "replaced (revision 2)" in page.locator(".messages").inner_text()
    shot(page, "07-tenant-secrets")
    page.locator("#secrets button:has-text('Delete')").click()
    assert "Secret acme/search-key deleted." in page.locator(".messages").inner_text()
    assert "None yet." in page.locator("#secrets").inner_text()
