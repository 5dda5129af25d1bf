"""A real headless Chromium (Debian's package) driven by Playwright, against the live test server."""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (make test does this as root).")
    return path


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


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def login(page, username: str, password: str) -> None:  # type: ignore[no-untyped-def]
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector(".sidebar")


# Fixtures of the capabilities the browser tests walk through.
from tests.regions.conftest import make_region, tiny_model_dir  # noqa: E402, F401
