"""Accessibility and small screens, in real Chromium (issue 30, item 20 and
the axe check): axe-core on every console page, in the light and the dark
scheme, with no serious or critical violation; every page fits a 390 px
screen; a skip link and a visible focus ring; times in the viewer's zone
with the zone named; select-all ticks a page.

"Every console page" is every route of the ``console`` namespace: each GET
page is opened (ids filled from the world below), the confirmation pages
that only a POST reaches are reached by submitting their forms, and the
routes that are not pages (an export, POST-only actions that redirect) are
listed in ``NOT_PAGES``. A new console route that is in neither list fails
``test_every_console_route_is_checked``.

axe-core comes from npm (``tests/a11y/package.json``, pinned): installed by
``.ci/run``, or by this module when npm is on the machine; without both the
tests are skipped with a reason locally (CI fails on any skip).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property
from retention.services import legal_hold_place

from . import chromium
from .chromium import browser_page, log_in, needs_chromium
from .conftest import make_records, make_user, utc

A11Y = Path(__file__).resolve().parent / "a11y"
AXE = A11Y / "node_modules" / "axe-core" / "axe.min.js"
OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store refused the credentials, rotating"
BLOCKING = {"serious", "critical"}
# Console routes that are not pages: an export and POST-only actions that
# answer with a redirect (their error answers are the pages checked here).
NOT_PAGES = {
    "console:sweep_proof",
    "console:jobs_export",
    "console:dead_letters_export",
    "console:job_action",
    "console:pause",
    "console:cluster_control",
    "console:limit_change",
}
# Reached by submitting a form (``confirmation_pages``), not by a GET.
POSTED = {"console:dead_letter_action", "console:jobs_selected"}


def _axe_available() -> bool:
    if AXE.exists():
        return True
    npm = shutil.which("npm")
    if npm is None:
        return False
    subprocess.run(  # noqa: S603 - a fixed command on our own package.json
        [npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=A11Y, check=False, timeout=600
    )
    return AXE.exists()


browser = chromium.browser


pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not _axe_available():
        pytest.skip("needs axe-core: npm ci in tests/a11y (npm is not installed here); CI installs it")
    return AXE.read_text()


@pytest.fixture
def world(portfolio, prop, active_policy, settings) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A sweep with a finished job, a pending one and two dead letters (HTTP
    403 and 400), a paused portfolio, audit events; an operator and a
    property manager (whose console is the landing page)."""
    settings.CONSOLE_REFRESH_SECONDS = 600  # the pages stay still while axe reads them
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    make_records(prop, "lease", 3, ended=OLD)
    other = Property.objects.create(portfolio=portfolio, name="Quay Court")
    make_records(other, "lease", 2, ended=OLD)
    make_records(other, "maintenance_record", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=portfolio, name="Mill Lane"), "lease", 1, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    job_run_slice(job_id=jobs[0].pk)

    def forbidden(job_id: int) -> None:
        raise DownstreamError(403, content_type="application/problem+json")

    def rejected(job_id: int) -> None:
        raise DownstreamError(400)

    job_run_slice(job_id=jobs[1].pk, before_batch=forbidden)
    job_run_slice(job_id=jobs[2].pk, before_batch=rejected)
    operator = make_user("op", "operator")
    make_user("pm", "property_manager")
    pipeline_pause(actor=operator, portfolio_id=portfolio.pk, reason="quarterly audit of the estate")
    # Issue 39, item 7: a hold for the portfolio and job pages' holds table,
    # a cluster for the workers page's quiet/drain form and its mode column.
    legal_hold_place(portfolio=portfolio, placed_by=operator, reason="litigation: tenancy dispute 2026-114")
    now = timezone.now()
    WorkerHeartbeat.objects.create(host="worker-1", cluster="default", pid=4242, started_at=now, updated_at=now)
    return {
        "sweep": Sweep.objects.get(),
        "job": jobs[0],
        "pending": jobs[3],
        "letter": DeadLetter.objects.order_by("id").first(),
        "portfolio": portfolio,
    }


def console_routes() -> dict[str, list[str]]:
    """Every route name of the ``console`` namespace → its parameter names."""
    found: dict[str, list[str]] = {}

    def walk(patterns: list[Any], namespace: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, entry.namespace or namespace)
            elif isinstance(entry, URLPattern) and namespace == "console":
                found[f"console:{entry.name}"] = list(entry.pattern.regex.groupindex)

    walk(get_resolver().url_patterns, "")
    return found


def get_pages(world: dict[str, Any]) -> dict[str, str]:
    """The URL of every console page a GET opens (``None`` of a route: not one)."""
    ids = {
        "sweep_id": world["sweep"].pk,
        "job_id": world["job"].pk,
        "letter_id": world["letter"].pk,
        "portfolio_id": world["portfolio"].pk,
    }
    extra = {
        "console:search": "?q=lease",
        "console:dead_letters_bulk": "?operation=redrive",
        "console:jobs_bulk": "?operation=run_now",
    }
    pages = {}
    for name, params in console_routes().items():
        if name in NOT_PAGES or name in POSTED:
            continue
        pages[name] = reverse(name, kwargs={p: ids[p] for p in params}) + extra.get(name, "")
    pages["console:jobs (sorted, a later page)"] = reverse("console:jobs") + f"?sort=attempts&after={world['job'].pk}"
    pages["console:jobs (filter tokens, 20 a page)"] = (
        reverse("console:jobs") + f"?portfolio={world['portfolio'].pk}&state=pending&sort=portfolio&per_page=20"
    )
    pages["console:dead_letters (filter tokens, by HTTP status)"] = (
        reverse("console:dead_letters") + "?http_status=403&sort=-http_status"
    )
    pages["console:sweeps (sorted by jobs)"] = reverse("console:sweeps") + "?sort=jobs&per_page=5"
    pages["bad request (400)"] = reverse("console:jobs") + "?state=bogus"
    return pages


def axe_run(page: Any, axe_source: str) -> list[dict[str, Any]]:
    # Evaluated through the browser's protocol, not as an inline <script>: the
    # page's Content-Security-Policy refuses inline scripts, and must keep doing so.
    page.evaluate(axe_source)
    result = page.evaluate(
        "async () => JSON.stringify((await axe.run(document, {resultTypes: ['violations']})).violations)"
    )
    return json.loads(result)


def describe(violations: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes'][:3]]}" for v in violations
    )


def no_overflow(page: Any) -> bool:
    return bool(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"))


def confirmation_pages(page: Any, world: dict[str, Any]) -> Iterator[str]:
    """The two confirmation pages only a POST reaches, by their forms."""
    page.goto(reverse("console:dead_letters"))
    page.locator(f"input[name=letter][value='{world['letter'].pk}']").check()
    page.get_by_label("reason", exact=True).fill(REASON)
    page.get_by_role("button", name="Review…").click()
    page.wait_for_url("**/dead-letters/action/")
    yield "console:dead_letter_action"
    page.goto(reverse("console:jobs"))
    page.locator(f"input[name=job][value='{world['pending'].pk}']").check()
    page.get_by_label("reason for the ticked jobs").fill(REASON)
    page.get_by_test_id("jobs-selected-review").click()
    page.wait_for_url("**/jobs/selected/")
    yield "console:jobs_selected"


def error_pages(page: Any, world: dict[str, Any]) -> Iterator[str]:
    """The error pages in the console's frame (issue 39, item 6): a 404, a
    failed CSRF check (the form sent without its cookie) and the 500 page
    (Django's ``server_error`` answer, served at a made-up address so its
    stylesheet comes from the live server). The CSRF cookie is cleared: last."""
    from django.test import RequestFactory
    from django.views.defaults import server_error

    page.goto("/console/no-such-page/")
    yield "404"
    html = server_error(RequestFactory().get("/")).content.decode()
    page.route("**/console/made-up-500/", lambda route: route.fulfill(status=500, body=html, content_type="text/html"))
    page.goto("/console/made-up-500/")
    yield "500"
    page.goto(reverse("console:dead_letters"))
    page.locator(f"input[name=letter][value='{world['letter'].pk}']").check()
    page.get_by_label("reason", exact=True).fill(REASON)
    page.context.clear_cookies(name="csrftoken")
    page.get_by_role("button", name="Review…").click()
    page.wait_for_selector("[data-csrf-failure]")
    yield "403 (CSRF)"


ID_PARAMS = {"sweep_id", "job_id", "letter_id", "portfolio_id"}


def test_every_console_route_is_checked() -> None:
    """``get_pages`` opens every route but the listed ones; a route whose
    parameters it cannot fill would fail there, so it fails here first."""
    routes = console_routes()
    assert len(routes) > 15, "no console routes found"
    assert NOT_PAGES <= set(routes) and POSTED <= set(routes), "a listed route no longer exists"
    unfillable = {
        name: params for name, params in routes.items() if name not in NOT_PAGES and not set(params) <= ID_PARAMS
    }
    assert not unfillable, f"routes the accessibility check cannot open: {unfillable}"


def test_axe_finds_no_serious_or_critical_violation_on_any_console_page_in_light_and_dark(
    browser, live_server, world, axe_source
) -> None:
    pages = get_pages(world)
    # The harness sees what it must: the old "updated" stamp's colours (2.02:1) are a serious violation.
    context, page = browser_page(browser, live_server)
    page.goto("/accounts/login/")
    page.evaluate(
        "() => { const p = document.createElement('p'); p.textContent = 'updated 02:00:00 UTC';"
        " p.style.cssText = 'color:#666;background:#23395d'; document.querySelector('main').append(p); }"
    )
    assert any(v["id"] == "color-contrast" and v["impact"] == "serious" for v in axe_run(page, axe_source))
    context.close()
    seen: Counter[str] = Counter()
    blocking: list[str] = []
    checked: list[str] = []
    for scheme in ("light", "dark"):
        context, page = browser_page(browser, live_server, color_scheme=scheme)
        try:
            for name, url in [("login", "/accounts/login/")]:
                page.goto(url)
                found = axe_run(page, axe_source)
                checked.append(f"{name} [{scheme}]")
                seen.update(f"{v['impact']} {v['id']}" for v in found)
                blocking += [f"{name} [{scheme}]: {describe([v])}" for v in found if v["impact"] in BLOCKING]
            log_in(page, "pm")
            found = axe_run(page, axe_source)
            checked.append(f"landing (property manager) [{scheme}]")
            seen.update(f"{v['impact']} {v['id']}" for v in found)
            blocking += [f"landing [{scheme}]: {describe([v])}" for v in found if v["impact"] in BLOCKING]
            page.context.clear_cookies()
            log_in(page, "op")
            page.wait_for_selector("#live-status:not(:empty)")  # the "updated" stamp is on the page
            for name, url in pages.items():
                page.goto(url)
                found = axe_run(page, axe_source)
                checked.append(f"{name} [{scheme}]")
                seen.update(f"{v['impact']} {v['id']}" for v in found)
                blocking += [f"{name} [{scheme}] {url}: {describe([v])}" for v in found if v["impact"] in BLOCKING]
            # One page at a time: each generator opens its next page only when asked.
            for name in itertools.chain(confirmation_pages(page, world), error_pages(page, world)):
                found = axe_run(page, axe_source)
                checked.append(f"{name} [{scheme}]")
                seen.update(f"{v['impact']} {v['id']}" for v in found)
                blocking += [f"{name} [{scheme}]: {describe([v])}" for v in found if v["impact"] in BLOCKING]
        finally:
            context.close()
    # The closing note's figures (pytest -s).
    print(
        f"axe-core: {len(checked)} page checks ({len(checked) // 2} pages x light/dark); "
        f"violations by impact {dict(seen)}"
    )
    assert not blocking, "\n".join(blocking)
    assert len(checked) >= 2 * 18


def test_every_console_page_fits_a_390_px_screen(browser, live_server, world) -> None:
    context, page = browser_page(browser, live_server, viewport={"width": 390, "height": 844})
    try:
        log_in(page, "op")
        wide = []
        for name, url in get_pages(world).items():
            page.goto(url)
            if not no_overflow(page):
                width = page.evaluate("() => document.documentElement.scrollWidth")
                wide.append(f"{name} {url}: {width} px")
        for name in itertools.chain(confirmation_pages(page, world), error_pages(page, world)):
            if not no_overflow(page):
                wide.append(name)
        assert not wide, wide
    finally:
        context.close()


def test_a_skip_link_is_first_and_focus_is_always_visible(browser, live_server, world) -> None:
    context, page = browser_page(browser, live_server)
    try:
        log_in(page, "op")
        page.goto(reverse("console:dead_letters"))
        page.keyboard.press("Tab")
        skip = page.locator(".skip-link")
        assert page.evaluate("() => document.activeElement.className") == "skip-link"
        box = skip.bounding_box()
        assert box is not None and box["y"] >= 0  # on screen once focused
        page.keyboard.press("Enter")
        assert page.evaluate("() => document.activeElement.id") == "main"
        for _ in range(3):
            page.keyboard.press("Tab")
            ring = page.evaluate(
                "() => { const s = getComputedStyle(document.activeElement);"
                " return [s.outlineStyle, parseFloat(s.outlineWidth)]; }"
            )
            assert ring[0] != "none" and ring[1] >= 2, ring
    finally:
        context.close()


def test_the_dark_scheme_follows_the_system(browser, live_server, world) -> None:
    colours = {}
    for scheme in ("light", "dark"):
        context, page = browser_page(browser, live_server, color_scheme=scheme)
        try:
            log_in(page, "op")
            colours[scheme] = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        finally:
            context.close()
    assert colours == {"light": "rgb(255, 255, 255)", "dark": "rgb(21, 25, 30)"}


def test_times_show_in_the_viewers_zone_with_the_zone_named(browser, live_server, world) -> None:
    context, page = browser_page(browser, live_server, timezone_id="America/New_York", locale="en-US")
    try:
        log_in(page, "op")
        assert page.get_by_test_id("viewer-zone").text_content() == "times in America/New_York"
        page.wait_for_selector("#live-status:not(:empty)")
        stamp = page.get_by_test_id("live-status").text_content() or ""
        assert re.fullmatch(r"updated \d\d:\d\d:\d\d (EDT|EST|GMT-4|GMT-5)", stamp), stamp
        page.goto(reverse("console:dead_letter", args=[world["letter"].pk]))
        first_seen = world["letter"].first_seen_at.astimezone(ZoneInfo("America/New_York"))
        shown = page.locator("time[data-local=text]").first.text_content() or ""
        assert shown.startswith(first_seen.strftime("%Y-%m-%d %H:%M")), shown
        assert not shown.endswith("UTC")
        title = page.locator("time[data-local=title]").first.get_attribute("title") or ""
        assert "UTC)" in title and re.search(r"\d\d:\d\d:\d\d (EDT|EST|GMT-4|GMT-5)", title), title
        assert isinstance(first_seen, datetime)
    finally:
        context.close()


def test_select_all_ticks_every_open_letter_on_the_page_and_pauses_the_refresh(browser, live_server, world) -> None:
    context, page = browser_page(browser, live_server)
    try:
        log_in(page, "op")
        page.goto(reverse("console:dead_letters"))
        boxes = page.locator("input[name=letter]")
        assert boxes.count() == 2
        page.get_by_test_id("select-all-letters").check()
        assert all(boxes.nth(i).is_checked() for i in range(boxes.count()))
        assert page.evaluate("() => window.consoleMayRefresh()") is False
        page.get_by_test_id("select-all-letters").uncheck()
        assert not any(boxes.nth(i).is_checked() for i in range(boxes.count()))
    finally:
        context.close()


def test_live_pages_refresh_every_5_seconds_by_default(client, world, settings) -> None:
    del settings.CONSOLE_REFRESH_SECONDS
    client.force_login(make_user("op2", "operator"))
    body = client.get(reverse("console:jobs")).content.decode()
    assert 'hx-trigger="every 5s' in body and "Live (every 5 s)" in body
