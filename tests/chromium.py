"""The console in a real browser: headless Chromium via Playwright, against
``live_server``, for every browser test file (``test_console_*browser.py`` and
``test_console_accessibility.py``).

One browser a test module (the ``browser`` fixture), one context a test (``page``,
or ``browser_page`` for options such as a colour scheme or a viewport), each
context refusing every request that would leave the test's server. A module
uses them as ``browser = chromium.browser`` and ``page = chromium.page`` (a
fixture is found by its name in the module) and marks itself ``needs_chromium``
with the ``transaction=True`` database (the live server serves from another
thread, so the rows it reads must be committed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "pw-for-tests"  # what conftest.make_user sets
TIMEOUT_MS = 15_000

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium); CI installs it",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop registered in this thread, so
    # Django would refuse ORM calls made here while the browser is open. The
    # ORM calls in these tests are plain synchronous code between page actions.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def browser_page(browser: Any, live_server: Any, **options: Any) -> tuple[Any, Any]:
    """A new context (Playwright's ``new_context`` options) and its page, on the test's server only.

    pytest-django names the server ``localhost``; the page talks to it as
    127.0.0.1 and every request that would go anywhere else is aborted.
    """
    origin = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    context = browser.new_context(base_url=origin, **options)
    context.route(re.compile(rf"^(?!{re.escape(origin)}/).*"), lambda route: route.abort())
    context.set_default_timeout(TIMEOUT_MS)
    return context, context.new_page()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context, tab = browser_page(browser, live_server)
    yield tab
    context.close()


@pytest.fixture
def still_page(browser: Any, live_server: Any, settings: Any) -> Iterator[Any]:
    """A page whose live refresh waits ten minutes (it stays still while the test reads it), downloads allowed."""
    settings.CONSOLE_REFRESH_SECONDS = 600
    context, tab = browser_page(browser, live_server, accept_downloads=True)
    yield tab
    context.close()


def log_in(page: Any, username: str) -> None:
    """The console's login form, as ``username`` with the tests' password; lands on the console."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/console/")
    expect(page.locator("header").get_by_text(username)).to_be_visible()


def log_in_admin(page: Any, username: str) -> None:
    """The admin's login form, as ``username`` with the tests' password; lands on the admin's index."""
    page.goto("/admin/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/admin/")
