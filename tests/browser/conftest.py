"""Playwright fixtures: one Chromium per test module, a fresh browser context per test.

Skips when playwright or Chromium is missing; with GATOR_BROWSER_TESTS=required it fails
instead. GATOR_CHROMIUM names another Chromium binary (default /usr/bin/chromium).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest

from tests.conftest import ROOT

CHROMIUM = os.environ.get("GATOR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REQUIRED = os.environ.get("GATOR_BROWSER_TESTS", "").strip().lower() == "required"
VIEWPORT = {"width": 1280, "height": 900}
SCREENSHOTS = ROOT / "docs" / "screenshots"
# The admin's CSS and JavaScript, served by the live server (see live_server).
ADMIN_STATIC = (Path(django.contrib.admin.__file__).parent / "static").resolve()
STATIC_URL = "/static/"


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under GATOR_BROWSER_TESTS=required."""
    if REQUIRED:
        pytest.fail(
            f"GATOR_BROWSER_TESTS=required, but the browser tests cannot run: {reason}",
            pytrace=False,
        )
    pytest.skip(f"browser tests: {reason} (`make browser-deps` installs what they need)")


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"the playwright package is not importable ({exc})"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set GATOR_CHROMIUM)"
    return None


# Asked once, when pytest loads this file, and kept: the test modules import playwright's
# `expect` at collection, so a playwright installed later in the same run (CI installs it for
# its browser stage while another stage's pytest, sharing the virtualenv, is running) must
# not turn skipped tests into tests whose `expect` is None.
MISSING = missing()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium, shared by the tests of one module.

    Playwright's sync API keeps an asyncio event loop running in this thread for as long as
    it is started, which makes Django refuse ORM calls from it (SynchronousOnlyOperation).
    The tests are plain synchronous code, so they allow it, for this module only: the loop
    and the setting both end with the module, before any other test runs."""
    if MISSING:
        unavailable(MISSING)
    from playwright.sync_api import Error, sync_playwright

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        playwright = sync_playwright().start()
        try:
            try:
                chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            except Error as exc:
                unavailable(f"{CHROMIUM} does not start: {exc.message.splitlines()[0]}")
            try:
                yield chromium
            finally:
                chromium.close()
        finally:
            playwright.stop()


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """pytest-django's live server, started with STATIC_URL and STATIC_ROOT set.

    The test settings have neither (no django.contrib.staticfiles), and the server's static
    files handler reads STATIC_URL once, when it starts: without it, every request fails.
    ``page`` sets both again for each test, so that pages link to /static/ and the server
    answers from django/contrib/admin/static."""
    from django.test.utils import override_settings
    from pytest_django.live_server_helper import LiveServer

    addr = (
        request.config.getvalue("liveserver")
        or os.getenv("DJANGO_LIVE_TEST_SERVER_ADDRESS")
        or "localhost"
    )
    with override_settings(STATIC_URL=STATIC_URL, STATIC_ROOT=str(ADMIN_STATIC)):
        server = LiveServer(addr)
    yield server
    server.stop()


@pytest.fixture
def page(browser: Any, live_server: Any, settings: Any) -> Iterator[Any]:
    """A page in a fresh browser context (no cookies), about 1280x900, whose relative URLs
    go to the live server."""
    settings.STATIC_URL = STATIC_URL
    settings.STATIC_ROOT = str(ADMIN_STATIC)
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def screenshot() -> Callable[[Any, str], None]:
    """screenshot(page, "name") saves docs/screenshots/name.png (full page) when
    GATOR_SCREENSHOTS=1, and does nothing otherwise, so test runs leave the repository alone.

    The admin's navigation sidebar is closed first: it takes 300 of the 1280 pixels, and in a
    full-page capture its sticky box lands in the middle of a long page."""

    def take(page: Any, name: str) -> None:
        if os.environ.get("GATOR_SCREENSHOTS") != "1":
            return
        sidebar = page.locator("#nav-sidebar")
        if sidebar.count() and sidebar.is_visible():
            page.locator("#toggle-nav-sidebar").click()  # remembered for the browser context
            from playwright.sync_api import expect

            expect(sidebar).to_be_hidden()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    return take
