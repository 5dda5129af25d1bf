"""A real headless Chromium (Debian's package) driven by Playwright, against the live test server."""

import os
from collections.abc import Iterator

import pytest

from tests.support.browser import CHROMIUM_FLAGS, chromium_path
from tests.support.overview import fleet  # noqa: F401  (a fixture: the Overview's fleet)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls the live server makes from
    # its own threads are unaffected, and the test's own ORM calls are synchronous by design.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser, live_server):  # type: ignore[no-untyped-def]
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15000)
    yield tab
    context.close()
