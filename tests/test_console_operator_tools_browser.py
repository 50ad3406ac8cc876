"""The operator tools of issue 39, item 7, in a browser: a filter token
removed by a click, the rows-per-page chooser, the CSV export downloaded,
the holds on a job page, and a cluster quieted from the workers page.
Headless Chromium against ``live_server``, as in ``test_console_browser.py``
(whose fixtures these follow)."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, ClusterControl, DeadLetter, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.services import legal_hold_place

from . import chromium
from .chromium import log_in, needs_chromium
from .conftest import make_records, make_user, utc

browser = chromium.browser
page = chromium.still_page  # the live refresh waits ten minutes: the page stays still while the test reads it


OLD = utc("2020-01-01T00:00:00Z")
REASON = "store maintenance window, 22:00 to 23:00"

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def world(portfolio, active_policy, reviewer) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Acme: three properties with leases (the first dead-lettered); Birch: one."""
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for j in range(3):
        make_records(Property.objects.create(portfolio=portfolio, name=f"A{j}"), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="B0"), "lease", 2, ended=OLD)
    sweep_trigger()

    def rejected(job_id: int) -> None:
        raise DownstreamError(400)

    jobs = list(CleanupJob.objects.order_by("id"))
    job_run_slice(job_id=jobs[0].pk, before_batch=rejected)
    make_user("op", "operator")
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation: tenancy dispute 2026-114")
    return {"acme": portfolio, "birch": birch, "jobs": jobs, "hold": hold, "letter": DeadLetter.objects.get()}


def test_a_click_on_a_filter_token_drops_that_filter_and_keeps_the_others(page, world) -> None:
    log_in(page, "op")
    page.goto(f"/console/jobs/?portfolio={world['acme'].pk}&state=pending")
    expect(page.get_by_test_id("jobs-count")).to_contain_text("2 jobs match")
    page.get_by_role("link", name="remove the filter portfolio: Acme Lettings").click()
    page.wait_for_url(re.compile(r"state=pending"))
    expect(page.get_by_test_id("jobs-count")).to_contain_text("3 jobs match")
    assert "portfolio=" not in page.url
    expect(page.get_by_role("link", name="remove the filter state: Pending")).to_be_visible()


def test_the_rows_per_page_chooser_pages_the_list_by_that_many(page, world) -> None:
    log_in(page, "op")
    page.goto("/console/jobs/?sort=portfolio")
    page.get_by_label("Rows per page").select_option("20")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"per_page=20"))
    assert "sort=portfolio" in page.url
    expect(page.get_by_test_id("position").first).to_have_text("Jobs 1 to 4 of 4")


def test_the_export_link_downloads_the_filtered_list_as_csv(page, world) -> None:
    log_in(page, "op")
    page.goto(f"/console/jobs/?portfolio={world['birch'].pk}")
    with page.expect_download() as info:
        page.get_by_test_id("export-csv").click()
    download = info.value
    assert download.suggested_filename == "jobs.csv"
    lines = open(download.path(), encoding="utf-8").read().splitlines()
    assert lines[0].startswith("job_id,sweep_id,sweep,portfolio_id") and len(lines) == 2
    assert f",{world['birch'].pk}," in lines[1]


def test_the_job_page_shows_the_hold_that_covers_it(page, world) -> None:
    log_in(page, "op")
    page.goto(f"/console/jobs/{world['jobs'][1].pk}/")
    holds = page.get_by_test_id("holds")
    expect(holds).to_contain_text("1 active hold:")
    expect(holds.get_by_test_id(f"hold-{world['hold'].pk}")).to_contain_text("tenancy dispute 2026-114")


def test_an_operator_quiets_a_cluster_from_the_workers_page(page, world, settings) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        host=socket.gethostname(), cluster="default", pid=4242, started_at=now, updated_at=now
    )
    log_in(page, "op")
    page.goto("/console/workers/")
    form = page.get_by_test_id("cluster-control")
    form.get_by_label("what to do").select_option("quiet")
    form.get_by_label("reason for the cluster decision").fill(REASON)
    form.get_by_role("button", name="Apply").click()
    page.wait_for_url("**/console/workers/")
    expect(page.get_by_test_id("message").first).to_contain_text("is quiet: it takes no new work")
    expect(page.get_by_test_id("cluster-mode").first).to_contain_text("Quiet")
    assert ClusterControl.objects.get().mode == "quiet"
