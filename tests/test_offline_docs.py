"""The API docs load nothing from outside the host — issue 19, item 7.

The HTML of Swagger UI and Redoc names no external URL (no CDN, no Google
Fonts, no validator badge), and a real browser opening them sends every
request to the application's own address. (Redoc's bundle renders the
Redocly logo from its CDN whatever the page says; the docs pages'
Content-Security-Policy makes the browser refuse it before it is sent, which
Playwright reports as a request that failed with "csp".)
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.test import Client

from . import chromium
from .chromium import log_in, needs_chromium
from .conftest import make_user

DOCS = ["/api/v1/docs/", "/api/v1/redoc/"]
EXTERNAL = re.compile(r"(?:https?:)?//(?!testserver)[a-z0-9.-]+\.[a-z]{2,}", re.IGNORECASE)

browser = chromium.browser


@pytest.mark.django_db
@pytest.mark.parametrize("path", DOCS)
def test_the_docs_page_names_no_external_url(path):
    client = Client()
    client.force_login(make_user("reader", "auditor"))
    response = client.get(path)
    assert response.status_code == 200
    # Redoc's bundle renders the Redocly logo from a CDN whatever the page says: the policy stops it.
    assert "img-src 'self' data:" in response["Content-Security-Policy"]
    page = response.content.decode()
    assert not EXTERNAL.findall(page), EXTERNAL.findall(page)
    assert "fonts.googleapis.com" not in page and "cdn.jsdelivr.net" not in page
    if path.endswith("docs/"):
        # Swagger UI's start-up script is a request of its own (no inline script: the CSP).
        script = client.get(path + "?script=").content.decode()
        assert not EXTERNAL.findall(script), EXTERNAL.findall(script)
        assert '"validatorUrl": null' in script  # no badge fetched from validator.swagger.io


@needs_chromium
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", DOCS)
def test_a_browser_opening_the_docs_asks_only_the_application(browser, live_server, path):
    origin = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    make_user("reader", "auditor")
    context = browser.new_context(base_url=origin)
    requested: list[str] = []
    blocked: list[str] = []  # refused by the page's Content-Security-Policy: never sent
    context.on("request", lambda request: requested.append(request.url))
    context.on(
        "requestfailed",
        lambda request: blocked.append(request.url) if "csp" in (request.failure or "").lower() else None,
    )
    context.route(re.compile(rf"^(?!{re.escape(origin)}/).*"), lambda route: route.abort())
    page = context.new_page()
    try:
        log_in(page, "reader")
        requested.clear()
        page.goto(path)
        page.wait_for_load_state("networkidle")
        assert page.locator("body").inner_text().strip(), "the docs rendered nothing"
    finally:
        context.close()
    outside = [url for url in requested if not url.startswith((origin + "/", "data:", "blob:")) and url not in blocked]
    assert not outside, (outside, blocked)
    assert any("/static/drf_spectacular_sidecar/" in url for url in requested)
    assert any(url.startswith(origin + "/api/v1/schema/") for url in requested)
