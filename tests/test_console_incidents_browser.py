"""The console under incidents, in a real browser (headless Chromium via
Playwright, like ``test_console_browser``): the forecast naming a pause, the
workers page agreeing with ``cleanup_health --liveness`` for a delete and a
purge cluster, the stale badge when live refresh fails, a short reason that
keeps the selection, a customer's landing page, run now and cancel on a
backing-off job, and search.

Times are real (no time machine): the browser's cookies live in real time.
"""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, PurgeRequest, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent, Membership

from . import chromium
from .chromium import log_in, needs_chromium
from .conftest import make_records, make_user, utc

# The browser and its page (a context per test): tests/chromium.py's fixtures.
browser = chromium.browser
page = chromium.page

OLD = utc("2020-01-01T00:00:00Z")
REASON = "the document store answers again"

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


def rejected(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def estate(portfolio, active_policy):  # type: ignore[no-untyped-def]
    """Acme (Harbour House, Quay Court) and Birch (Birch Row), one pending job each, admitted now."""
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for owner, name in ((portfolio, "Harbour House"), (portfolio, "Quay Court"), (birch, "Birch Row")):
        make_records(Property.objects.create(portfolio=owner, name=name), "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = {Property.objects.get(pk=j.property_id).name: j for j in CleanupJob.objects.all()}
    assert len(jobs) == 3
    return {"acme": portfolio, "birch": birch, "jobs": jobs}


def a_cluster(*, cluster: str, queue: str, quiet_minutes: float = 0.5) -> WorkerHeartbeat:
    now = timezone.now()
    return WorkerHeartbeat.objects.create(
        host=socket.gethostname(),
        cluster=cluster,
        queue=queue,
        pid=7,
        started_at=now - timedelta(hours=1),
        last_progress_at=now - timedelta(minutes=quiet_minutes),
        updated_at=now - timedelta(minutes=quiet_minutes),
    )


def test_the_forecast_names_the_pause_that_holds_the_open_work(page, estate) -> None:
    a_cluster(cluster="deleter", queue="")
    pipeline_pause(actor=None, reason="month-end freeze for Acme", portfolio_id=estate["acme"].pk)
    pipeline_pause(actor=None, reason="Birch migrates its data", portfolio_id=estate["birch"].pk)
    make_user("op", "operator")
    log_in(page, "op")
    forecast = page.get_by_test_id("forecast")
    assert forecast.get_attribute("data-status") == "blocked"
    text = forecast.inner_text()
    assert "Will not finish" in text and "none of the 3 open jobs can run" in text
    assert "2 open jobs of Acme Lettings wait: the portfolio is paused" in text
    assert "month-end freeze for Acme" in text and "Birch migrates its data" in text
    assert "On track" not in page.locator("main").inner_text()
    assert page.get_by_test_id("oldest-due").inner_text() == "none can run"  # not "none", read as "no worker"
    assert page.get_by_test_id("waiting-paused").inner_text() == "3 paused"


def test_the_workers_page_agrees_with_cleanup_health_for_a_delete_and_a_purge_cluster(
    page, estate, settings, monkeypatch
) -> None:
    from django.conf import settings as live

    purge_queue, main_queue = live.Q_PURGE_CLUSTER, live.Q_CLUSTER["name"]
    assert purge_queue != main_queue
    now = timezone.now()
    # Due delete work waits for 10 minutes; the delete cluster made no progress for 20: wedged.
    CleanupJob.objects.filter(pk=estate["jobs"]["Harbour House"].pk).update(available_at=now - timedelta(minutes=10))
    # The only due purge work belongs to a paused portfolio: the purge cluster has nothing it could take.
    birch_job = estate["jobs"]["Birch Row"]
    CleanupJob.objects.filter(portfolio_id=estate["birch"].pk).update(state="done")
    request = PurgeRequest.objects.create(
        key="b" * 64,
        delete_job=birch_job,
        portfolio_id=birch_job.portfolio_id,
        property_id=birch_job.property_id,
        record_kind="lease",
        document_ids=["doc-1"],
        created_at=now,
    )
    CleanupJob.objects.create(
        sweep=birch_job.sweep,
        key=f"{birch_job.key}:purge",
        job_kind=JobKind.PURGE,
        purge_request=request,
        portfolio_id=birch_job.portfolio_id,
        property_id=birch_job.property_id,
        record_kind="lease",
        policy_version=birch_job.policy_version,
        cutoff=birch_job.cutoff,
        available_at=now - timedelta(minutes=10),
    )
    pipeline_pause(actor=None, reason="Birch migrates its data", portfolio_id=estate["birch"].pk)
    a_cluster(cluster="deleter", queue=main_queue, quiet_minutes=20)
    a_cluster(cluster="purger", queue=purge_queue, quiet_minutes=20)

    def probe(cluster: str, queue: str) -> dict:
        settings.CLEANUP_CLUSTER_NAME = cluster
        monkeypatch.setenv("Q_CLUSTER_NAME", queue)
        out = StringIO()
        try:
            call_command("cleanup_health", "--liveness", "--json", stdout=out)
        except SystemExit:
            pass
        return json.loads(out.getvalue())["checks"][0]

    delete_check, purge_check = probe("deleter", main_queue), probe("purger", purge_queue)
    assert not delete_check["ok"] and delete_check["detail"].startswith("wedged")
    assert purge_check["ok"] and purge_check["detail"] == "idle: no due work it could take"

    make_user("op", "operator")
    log_in(page, "op")
    page.goto("/console/workers/")
    for name, check in (("deleter", delete_check), ("purger", purge_check)):
        row = page.get_by_test_id(f"cluster-{name}")
        state = row.get_by_test_id("cluster-state").get_attribute("data-state")
        assert state == ("idle" if check["ok"] else "wedged"), name
        shown = row.get_by_test_id("cluster-detail").inner_text()
        # The same words, but for the seconds that passed between the probe and the page.
        assert shown.split(" ")[:4] == check["detail"].split(" ")[:4], (name, shown, check["detail"])
    assert "purge" in page.get_by_test_id("cluster-purger").inner_text()


def test_a_failing_live_refresh_shows_a_stale_badge_and_a_good_one_clears_it(page, estate, settings) -> None:
    settings.CONSOLE_REFRESH_SECONDS = 1
    make_user("op", "operator")
    log_in(page, "op")
    status = page.get_by_test_id("live-status")
    assert status.inner_text().startswith("updated ")
    failing = {"on": True}

    def refresh(route):  # type: ignore[no-untyped-def]
        if route.request.headers.get("hx-request") and failing["on"]:
            route.fulfill(status=503, body="down")
        else:
            route.continue_()

    page.route("**/console/*", refresh)
    page.route("**/console/", refresh)
    page.wait_for_selector('[data-testid="live-status"][data-stale="true"]', timeout=10_000)
    assert "STALE: refresh failing since" in status.inner_text() and "HTTP 503" in status.inner_text()
    failing["on"] = False
    page.wait_for_selector('[data-testid="live-status"]:not([data-stale])', timeout=10_000)
    assert status.inner_text().startswith("updated ")


def test_a_short_reason_keeps_the_ticked_letters_and_the_typed_reason(page, estate) -> None:
    for name in ("Harbour House", "Quay Court"):
        job_run_slice(job_id=estate["jobs"][name].pk, before_batch=rejected)
    letters = list(DeadLetter.objects.order_by("id"))
    make_user("op", "operator")
    log_in(page, "op")
    page.goto("/console/dead-letters/")
    for letter in letters:
        page.get_by_label(f"select {letter.pk}").check()
    page.get_by_label("operation").select_option("dismiss")
    page.get_by_label("reason", exact=True).fill("too short")
    with page.expect_response(lambda r: r.url.endswith("/console/dead-letters/action/")) as refused:
        page.get_by_role("button", name="Review…").click()
    assert refused.value.status == 400
    assert "at least 10 characters" in page.get_by_test_id("errors").inner_text()
    for letter in letters:
        assert page.get_by_label(f"select {letter.pk}").is_checked()
    assert page.get_by_label("reason", exact=True).input_value() == "too short"
    assert page.get_by_label("operation").input_value() == "dismiss"
    page.get_by_label("reason", exact=True).fill(REASON)
    page.get_by_role("button", name="Review…").click()
    page.get_by_role("button", name="Confirm dismiss").click()
    page.wait_for_url("**/console/dead-letters/")
    assert "Dismissed 2 dead letters." in page.get_by_test_id("message").first.inner_text()
    assert DeadLetter.objects.filter(status="dismissed").count() == 2


def test_a_customers_manager_lands_on_a_page_that_says_where_to_go(page, estate) -> None:
    manager = make_user("manager-acme")
    Membership.objects.create(user=manager, portfolio=estate["acme"], role="property_manager")
    log_in(page, "manager-acme")
    landing = page.get_by_test_id("landing")
    assert landing.inner_text() == "Welcome, manager-acme"
    main = page.locator("main").inner_text()
    assert "Acme Lettings" in main and "property manager" in main
    page.get_by_role("link", name="Retention policies").click()
    page.wait_for_url("**/admin/retention/retentionpolicy/")
    page.goto("/console/workers/")
    assert page.get_by_test_id("forbidden").inner_text() == "You do not have access to this page"
    expect(page.get_by_test_id("where-to-go").get_by_role("link", name="Retention policies")).to_be_visible()


def test_an_operator_runs_a_backing_off_job_now_and_cancels_another(page, estate) -> None:
    later = timezone.now() + timedelta(minutes=30)
    run, cancel = estate["jobs"]["Harbour House"], estate["jobs"]["Quay Court"]
    CleanupJob.objects.filter(pk__in=[run.pk, cancel.pk]).update(
        attempt=2, last_error_category="downstream_unavailable", available_at=later
    )
    make_user("op", "operator")
    log_in(page, "op")

    page.goto(f"/console/jobs/{run.pk}/")
    assert "backing off after a failure" in page.get_by_test_id("job-due").inner_text()
    page.get_by_label("job action", exact=True).select_option("run_now")
    page.get_by_label("job action reason").fill(REASON)
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(f"**/console/jobs/{run.pk}/")
    assert "1 job is due now" in page.get_by_test_id("message").first.inner_text()
    run.refresh_from_db()
    assert run.available_at <= timezone.now() and run.attempt == 2 and run.state == "pending"

    page.goto(f"/console/jobs/{cancel.pk}/")
    page.get_by_label("job action", exact=True).select_option("cancel")
    page.get_by_label("job action reason").fill(REASON)
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(f"**/console/jobs/{cancel.pk}/")
    letter = DeadLetter.objects.get(job=cancel)
    assert letter.category == "cancelled"
    assert "Cancelled by an operator" in page.get_by_test_id("job-letter").inner_text()
    assert page.get_by_test_id("job-actions").count() == 0  # dead: nothing left to run or cancel
    actions = set(AuditEvent.objects.filter(object_type="job").values_list("action", "object_id"))
    assert actions == {("job.run_now", str(run.pk)), ("job.cancelled", str(cancel.pk))}


def test_the_header_search_finds_jobs_letters_and_events_by_a_property_name(page, estate) -> None:
    job = estate["jobs"]["Quay Court"]
    job_run_slice(job_id=job.pk, before_batch=rejected)
    letter = DeadLetter.objects.get()
    make_user("op", "operator")
    log_in(page, "op")
    box = page.locator("header").get_by_label("search", exact=True)
    box.fill("quay")
    box.press("Enter")
    page.wait_for_url("**/console/search/?q=quay")
    expect(page.get_by_test_id(f"search-job-{job.pk}")).to_be_visible()
    assert "Quay Court" in page.get_by_test_id(f"search-letter-{letter.pk}").inner_text()
    assert page.get_by_test_id(f"search-job-{estate['jobs']['Harbour House'].pk}").count() == 0
    page.get_by_role("link", name="Every matching job").click()
    page.wait_for_url("**/console/jobs/?q=quay")
    assert page.get_by_test_id("jobs-count").inner_text().startswith("1 job matches")
