"""The walk's defects that only a browser shows (issue 39, item 6): keyboard
focus across a live refresh, and a typed reason kept across a failed CSRF
check. Headless Chromium against ``live_server``, as in
``test_console_browser.py`` (whose fixtures these follow)."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from . import chromium
from .chromium import PASSWORD, browser_page, log_in, log_in_admin, needs_chromium
from .conftest import make_records, make_user, utc

browser = chromium.browser
page = chromium.page


OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store's credentials were rotated, retrying"

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def letters(portfolio, active_policy) -> list[DeadLetter]:  # type: ignore[no-untyped-def]
    """Three open dead letters in three properties of Acme."""
    active_policy(portfolio, "lease", 365)
    for j in range(3):
        make_records(Property.objects.create(portfolio=portfolio, name=f"A{j}"), "lease", 2, ended=OLD)
    sweep_trigger()

    def rejected(job_id: int) -> None:
        raise DownstreamError(400)

    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=rejected)
    return list(DeadLetter.objects.order_by("id"))


def count_swaps(page: Any) -> None:
    page.evaluate(
        "() => { window.swaps = 0; document.addEventListener('htmx:afterSwap', () => { window.swaps += 1; }); }"
    )


# --- 1. Focus across a live refresh -----------------------------------------------------


def test_a_live_refresh_keeps_keyboard_focus_on_the_focused_link_and_tab_goes_on_from_it(
    page, letters, settings
) -> None:
    settings.CONSOLE_REFRESH_SECONDS = 1
    make_user("op", "operator")
    log_in(page, "op")
    page.goto("/console/jobs/")
    count_swaps(page)
    job = letters[1].job_id
    link = page.get_by_test_id(f"job-{job}").get_by_role("link", name=f"job {job}", exact=True)
    link.focus()
    page.wait_for_function("() => window.swaps >= 2", timeout=10_000)  # the table was replaced twice
    focused = page.evaluate("() => [document.activeElement.tagName, document.activeElement.textContent.trim()]")
    assert focused == ["A", f"job {job}"]
    assert page.evaluate("() => document.getElementById('live').contains(document.activeElement)")
    # The next Tab goes on within the row, not back to the top of the page.
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.closest('tr')?.dataset.testid") == f"job-{job}"


def test_a_live_refresh_keeps_focus_on_a_sort_header(page, letters, settings) -> None:
    settings.CONSOLE_REFRESH_SECONDS = 1
    make_user("op", "operator")
    log_in(page, "op")
    page.goto("/console/dead-letters/?status=")
    count_swaps(page)
    header = page.locator("#live thead a").first
    header.focus()
    text = header.text_content()
    page.wait_for_function("() => window.swaps >= 2", timeout=10_000)
    assert page.evaluate("() => document.activeElement.closest('thead') !== null")
    assert page.evaluate("() => document.activeElement.textContent") == text


# --- 2. A typed reason survives a failed CSRF check -------------------------------------


def test_a_reason_typed_before_a_csrf_failure_is_filled_in_again_on_a_fresh_form(page, letters) -> None:
    make_user("op", "operator")
    log_in(page, "op")
    page.goto("/console/dead-letters/")
    page.locator(f"input[name=letter][value='{letters[0].pk}']").check()
    page.get_by_label("operation").select_option("redrive")
    page.get_by_label("reason", exact=True).fill(REASON)
    page.context.clear_cookies(name="csrftoken")  # as if the token had gone (another tab, a new login)
    with page.expect_response(lambda r: r.url.endswith("/console/dead-letters/action/")) as failed:
        page.get_by_role("button", name="Review…").click()
    assert failed.value.status == 403
    expect(page.get_by_test_id("csrf-failure")).to_be_visible()
    assert "DEBUG" not in page.content()
    expect(page.get_by_test_id("csrf-draft-text")).to_have_text(REASON)

    page.get_by_test_id("csrf-back").click()
    page.wait_for_url("**/console/dead-letters/")
    expect(page.get_by_label("reason", exact=True)).to_have_value(REASON)
    # The fresh form works: review and confirm with the kept reason.
    page.locator(f"input[name=letter][value='{letters[0].pk}']").check()
    page.get_by_label("operation").select_option("redrive")
    page.get_by_role("button", name="Review…").click()
    expect(page.get_by_role("button", name="Confirm redrive")).to_be_visible()
    assert REASON in page.locator("main").inner_text()
    # Once a send went through, the draft is gone: the inbox opens with an empty reason.
    page.goto("/console/dead-letters/")
    expect(page.get_by_label("reason", exact=True)).to_have_value("")


# --- 5. The legal hold's property picker, every visit -----------------------------------


def picker_offers(page: Any, portfolio_label: str) -> list[str]:
    page.goto("/admin/retention/legalhold/add/")
    page.wait_for_load_state("load")
    page.locator("#id_portfolio").select_option(label=portfolio_label)
    page.locator("#id_property + .select2 .select2-selection").click()
    page.wait_for_selector(".select2-results__option:not(.loading-results)")
    options = page.locator(".select2-results__option").all_text_contents()
    page.keyboard.press("Escape")
    return sorted(options)


def test_the_hold_forms_property_picker_offers_only_the_chosen_portfolios_properties_on_every_visit(
    page, portfolio, prop
) -> None:
    from properties.models import Portfolio

    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    Property.objects.create(portfolio=birch, name="Birch Row")
    make_user("rev", "compliance_reviewer")
    log_in_admin(page, "rev")
    for _ in range(3):  # the first visit, and the later ones with every file cached
        assert picker_offers(page, str(portfolio)) == ["Harbour House"]
        assert picker_offers(page, str(birch)) == ["Birch Row"]


# --- 6. The admin's times in the viewer's zone, as the console's -----------------------


def test_the_browser_names_its_zone_and_the_admin_then_shows_times_in_it(browser, live_server, portfolio, prop) -> None:
    from django.utils import timezone

    from retention.services import legal_hold_place

    reviewer = make_user("rev", "compliance_reviewer")
    ids = make_records(prop, "lease", 1, ended=OLD)
    hold = legal_hold_place(
        portfolio=portfolio, record_kind="lease", record_id=ids[0], placed_by=reviewer, reason="litigation hold, x"
    )
    context, tab = browser_page(browser, live_server, timezone_id="America/New_York", locale="en-US")
    try:
        tab.goto("/admin/login/")
        assert [c["value"] for c in context.cookies() if c["name"] == "viewer_zone"] == ["America/New_York"]
        tab.locator("#id_username").fill("rev")
        tab.locator("#id_password").fill(PASSWORD)
        tab.locator("input[type=submit]").click()
        tab.wait_for_url("**/admin/")
        tab.goto("/admin/retention/legalhold/")
        placed = timezone.localtime(hold.placed_at, timezone=ZoneInfo("America/New_York"))
        expect(tab.locator("#result_list")).to_contain_text(placed.strftime("%Y-%m-%d %H:%M ") + placed.tzname())
    finally:
        context.close()
