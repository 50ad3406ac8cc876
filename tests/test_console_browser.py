"""The operator console in a real browser (headless Chromium via Playwright).

Runs against pytest-django's ``live_server`` (real HTTP on 127.0.0.1), so the
login form, CSRF tokens, the two-step dead-letter confirmation, redirects and
flash messages are exercised end to end, as an operator sees them.

Needs Debian's ``chromium`` at /usr/bin/chromium (``playwright install`` is not
used). Without it the tests are skipped with a reason; CI installs it and fails
on any skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobState
from cleanup_ops.recovery.classification import DownstreamError, FailureCategory
from cleanup_ops.schedule import sweep_trigger
from retention.models import AuditEvent

from . import chromium
from .chromium import log_in, needs_chromium
from .conftest import make_records, make_user, utc

browser = chromium.browser
page = chromium.page


REASON = "downstream store fixed the 400, retrying"
OLD = utc("2020-01-01T00:00:00Z")

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),  # live_server serves from another thread
]


@pytest.fixture
def dead_letter(portfolio, prop, active_policy) -> DeadLetter:  # type: ignore[no-untyped-def]
    """One open dead letter: a job whose downstream rejected it (HTTP 400)."""
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 3, ended=OLD)
    sweep_trigger()

    def rejected(job_id: int) -> None:
        raise DownstreamError(400)

    job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=rejected)
    letter = DeadLetter.objects.get()
    assert (letter.status, letter.category) == (DeadLetter.Status.OPEN, FailureCategory.DOWNSTREAM_REJECTED)
    return letter


def nav(page, name: str) -> None:  # type: ignore[no-untyped-def]
    """Follow a link of the console's header."""
    page.locator("header").get_by_role("link", name=name, exact=True).click()


def test_an_operator_redrives_a_dead_letter_with_a_reason_and_finds_it_in_the_audit_log(
    page, dead_letter, tmp_path: Path
) -> None:
    make_user("op", "operator")
    old_job = dead_letter.job
    log_in(page, "op")

    nav(page, "Dead letters")
    page.wait_for_url("**/console/dead-letters/")
    row = page.get_by_test_id(f"letter-{dead_letter.pk}")
    assert "Downstream rejected (4xx)" in row.inner_text()  # the label, not the slug

    # Without a reason the console stops at the confirmation step and changes nothing.
    events_before = AuditEvent.objects.count()
    row.get_by_label(f"select {dead_letter.pk}").check()
    page.get_by_label("operation").select_option("redrive")
    with page.expect_response(lambda r: r.url.endswith("/console/dead-letters/action/")) as refused:
        page.get_by_role("button", name="Review…").click()
    assert refused.value.status == 400
    assert "at least 10 characters" in page.get_by_test_id("errors").inner_text()
    assert page.get_by_role("button", name="Confirm redrive").count() == 0
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetter.Status.OPEN
    assert CleanupJob.objects.count() == 1
    assert AuditEvent.objects.count() == events_before

    # With a reason: review, confirm, and the inbox names the new job.
    page.get_by_role("link", name="Back to the inbox").click()
    page.get_by_test_id(f"letter-{dead_letter.pk}").get_by_label(f"select {dead_letter.pk}").check()
    page.get_by_label("operation").select_option("redrive")
    page.get_by_label("reason").fill(REASON)
    page.get_by_role("button", name="Review…").click()
    expect(page.get_by_role("heading", name="Redrive 1 dead letter?")).to_be_visible()
    assert REASON in page.locator("main").inner_text()
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetter.Status.OPEN  # nothing applied before the confirmation
    page.get_by_role("button", name="Confirm redrive").click()
    page.wait_for_url("**/console/dead-letters/")

    new_job = CleanupJob.objects.get(redrive_of=old_job)
    message = page.get_by_test_id("message").first.inner_text()
    assert message == f"Redrove 1 dead letter: see job {new_job.pk}."
    dead_letter.refresh_from_db()
    assert (dead_letter.status, dead_letter.redrive_job_id) == (DeadLetter.Status.REDRIVEN, new_job.pk)
    assert dead_letter.resolved_by.username == "op"
    assert new_job.key == f"{old_job.key}:redrive:1"
    assert new_job.state != JobState.DEAD
    event = AuditEvent.objects.get(action="dead_letter.redriven")
    assert (event.reason, event.actor.username) == (REASON, "op")
    assert page.get_by_test_id(f"letter-{dead_letter.pk}").count() == 0  # no longer in the open inbox

    nav(page, "Audit log")
    page.wait_for_url("**/console/audit/")
    audit_row = page.get_by_test_id(f"audit-{event.pk}")
    assert "dead_letter.redriven" in audit_row.inner_text()
    assert REASON in audit_row.inner_text()
    assert "op" in audit_row.inner_text()

    shot = tmp_path / "audit-after-redrive.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_an_auditor_sees_the_overview_and_charts_but_no_redrive_controls(page, dead_letter) -> None:
    auditor: User = make_user("audra", "auditor")
    assert not auditor.has_perm("cleanup_ops.redrive_deadletter")
    log_in(page, "audra")

    # An open dead letter waits for a decision: not a green "Pipeline running" (issue 30, item 11).
    banner = page.get_by_test_id("pipeline-state").inner_text()
    assert banner.startswith("Pipeline not paused") and "1 dead letter waits for a decision" in banner
    expect(page.locator('svg[aria-label="rows deleted per hour"]')).to_be_visible()
    expect(page.locator('svg[aria-label="failed attempts by category"]')).to_be_visible()
    expect(page.get_by_role("heading", name="Retention debt")).to_be_visible()
    assert page.get_by_role("button", name="Apply").count() == 0  # no pause form either

    nav(page, "Dead letters")
    page.wait_for_url("**/console/dead-letters/")
    expect(page.get_by_test_id(f"letter-{dead_letter.pk}")).to_be_visible()
    assert page.get_by_label("operation").count() == 0
    assert page.get_by_label("reason").count() == 0
    assert page.get_by_role("button", name="Review…").count() == 0
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetter.Status.OPEN


# --- The console's flows (issue 14) ----------------------------------------------------


def rejected(job_id: int) -> None:
    raise DownstreamError(400)


def dead_letters_in(portfolio, active_policy, n: int) -> list[DeadLetter]:  # type: ignore[no-untyped-def]
    """``n`` partitions of ``portfolio`` whose jobs dead-letter (downstream 400)."""
    from properties.models import Property

    active_policy(portfolio, "lease", 365)
    for j in range(n):
        make_records(Property.objects.create(portfolio=portfolio, name=f"{portfolio.slug}-{j}"), "lease", 2, ended=OLD)
    return []


def test_an_operator_redrives_all_letters_matching_a_filter_after_seeing_their_number(
    page, portfolio, active_policy
) -> None:
    from properties.models import Portfolio

    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    dead_letters_in(portfolio, active_policy, 2)
    dead_letters_in(birch, active_policy, 1)
    sweep_trigger()
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=rejected)
    acme_letters = set(DeadLetter.objects.filter(portfolio_id=portfolio.pk).values_list("id", flat=True))
    assert len(acme_letters) == 2 and DeadLetter.objects.count() == 3
    make_user("op", "operator")
    log_in(page, "op")

    nav(page, "Dead letters")
    page.wait_for_url("**/console/dead-letters/")
    assert page.get_by_test_id("bulk-redrive").inner_text() == "Redrive all 3 matching this filter…"
    page.get_by_label("portfolio", exact=True).select_option(label="Acme Lettings")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(f"**portfolio={portfolio.pk}**")
    page.get_by_test_id("bulk-redrive").click()

    heading = "Redrive all 2 open dead letters matching this filter?"
    expect(page.get_by_role("heading", name=heading)).to_be_visible()
    assert "portfolio Acme Lettings" in page.get_by_test_id("bulk-filter").inner_text()
    # Too short a reason: refused on the confirmation page, nothing changes.
    page.get_by_label("reason").fill("retry")
    page.get_by_role("button", name="Redrive all 2").click()
    expect(page.get_by_test_id("errors")).to_contain_text("at least 10 characters")
    assert DeadLetter.objects.filter(status="open").count() == 3

    page.get_by_label("reason").fill(REASON)
    page.get_by_role("button", name="Redrive all 2").click()
    page.wait_for_url("**/console/dead-letters/?**")
    assert page.get_by_test_id("message").first.inner_text() == "Redrove 2 dead letters: see the 2 new jobs."
    assert set(DeadLetter.objects.filter(status="redriven").values_list("id", flat=True)) == acme_letters
    assert DeadLetter.objects.get(portfolio_id=birch.pk).status == "open"  # outside the filter
    events = AuditEvent.objects.filter(action="dead_letter.redriven")
    assert {(e.reason, e.actor.username) for e in events} == {(REASON, "op")} and events.count() == 2


def test_an_operator_pauses_a_portfolio_by_its_name_and_resumes_it_with_a_reason(page, portfolio) -> None:
    from cleanup_ops.models import PipelinePause

    make_user("op", "operator")
    log_in(page, "op")
    nav(page, "Pauses")
    page.wait_for_url("**/console/pauses/")
    page.get_by_label("portfolio to pause").select_option(label="Acme Lettings (acme)")
    page.get_by_label("reason to pause the portfolio").fill("customer asked for a freeze")
    page.get_by_role("button", name="Pause portfolio").click()
    page.wait_for_url("**/console/pauses/")
    assert page.get_by_test_id("message").inner_text() == "Paused Acme Lettings."
    row = page.get_by_test_id(f"paused-{portfolio.pk}")
    assert "Acme Lettings" in row.inner_text() and "customer asked for a freeze" in row.inner_text()
    assert PipelinePause.objects.active().get().portfolio_id == portfolio.pk

    # The overview names the paused portfolio and links to its page.
    nav(page, "Overview")
    page.wait_for_url("**/console/")
    page.get_by_test_id(f"portfolio-pause-{portfolio.pk}").get_by_role("link", name="Acme Lettings").click()
    page.wait_for_url(f"**/console/portfolios/{portfolio.pk}/")
    assert page.get_by_test_id("portfolio-state").inner_text().startswith("Paused since")

    # Resume needs a reason: the browser will not submit an empty one.
    page.goto("/console/pauses/")
    resume = page.get_by_role("button", name="Resume Acme Lettings")
    resume.click()
    assert page.get_by_label("reason to resume Acme Lettings").evaluate("el => el.validity.valueMissing")
    assert PipelinePause.objects.active().exists()
    page.get_by_label("reason to resume Acme Lettings").fill("the freeze is over, go ahead")
    resume.click()
    page.wait_for_url("**/console/pauses/")
    assert page.get_by_test_id("message").inner_text() == "Resumed Acme Lettings."
    assert not PipelinePause.objects.active().exists()
    assert page.get_by_test_id(f"paused-{portfolio.pk}").count() == 0
    actions = list(AuditEvent.objects.order_by("id").values_list("action", "object_id", "actor__username"))
    assert actions == [("pipeline.paused", str(portfolio.pk), "op"), ("pipeline.resumed", str(portfolio.pk), "op")]


def test_the_job_page_is_reached_from_a_dead_letter(page, dead_letter) -> None:
    make_user("op", "operator")
    log_in(page, "op")
    job = dead_letter.job
    nav(page, "Dead letters")
    page.get_by_test_id(f"letter-{dead_letter.pk}").get_by_role("link", name=f"letter {dead_letter.pk}").click()
    page.wait_for_url(f"**/console/dead-letters/{dead_letter.pk}/")
    expect(page.get_by_role("heading", name=f"Dead letter {dead_letter.pk}")).to_be_visible()
    assert "Open" in page.get_by_test_id("letter-status").inner_text()

    page.get_by_test_id("letter-job").get_by_role("link", name=f"job {job.pk}").click()
    page.wait_for_url(f"**/console/jobs/{job.pk}/")
    expect(page.get_by_role("heading", name=f"Job {job.pk}")).to_be_visible()
    assert page.get_by_test_id("job-state").inner_text() == "Dead"
    assert f"letter {dead_letter.pk}" in page.get_by_test_id("job-letter").inner_text()
    assert "Downstream rejected (4xx)" in page.locator("main").inner_text()
    assert "Acme Lettings" in page.locator("main").inner_text()  # the portfolio's name, not its id
    page.get_by_test_id("job-letter").get_by_role("link", name=f"letter {dead_letter.pk}").click()
    page.wait_for_url(f"**/console/dead-letters/{dead_letter.pk}/")


def test_the_forecast_warns_when_the_sweep_will_not_finish_and_the_page_refreshes_itself(
    page, portfolio, active_policy, settings
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from cleanup_ops.models import Sweep

    settings.CLEANUP_SCHEDULE = "*/10 * * * *"  # the next slot is less than 10 minutes away
    settings.CONSOLE_REFRESH_SECONDS = 1
    dead_letters_in(portfolio, active_policy, 3)
    sweep = sweep_trigger().sweep
    now = timezone.now()
    # Half an hour in, one job finished five minutes ago: 1 job per 15 min, 2 left, 30 min to go.
    Sweep.objects.filter(pk=sweep.pk).update(admitted_at=now - timedelta(minutes=30))
    first = CleanupJob.objects.order_by("id").first()
    CleanupJob.objects.filter(pk=first.pk).update(
        state="done", outcome="deleted", finished_at=now - timedelta(minutes=5)
    )
    # A worker cluster reported a minute ago: the open jobs can run (without
    # one the forecast says they are blocked, waiting for a worker).
    from cleanup_ops.models import WorkerHeartbeat

    WorkerHeartbeat.objects.create(
        host="w1", cluster="default", pid=7, started_at=now - timedelta(hours=1), updated_at=now - timedelta(minutes=1)
    )
    make_user("op", "operator")
    log_in(page, "op")

    warning = page.get_by_test_id("forecast")
    assert warning.get_attribute("data-status") == "late"
    assert "Will not finish before the next slot" in warning.inner_text()
    assert "2 open jobs that can run" in warning.inner_text()
    nav(page, "Sweeps")
    page.wait_for_url("**/console/sweeps/")
    assert page.get_by_test_id("forecast").get_attribute("data-status") == "late"
    page.get_by_role("link", name=sweep.key).first.click()
    page.wait_for_url(f"**/console/sweeps/{sweep.pk}/")
    assert page.get_by_test_id("forecast").get_attribute("data-status") == "late"

    # While the tab is hidden the page does not poll ...
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if r.headers.get("hx-request") else None)
    page.evaluate("Object.defineProperty(document, 'hidden', {configurable: true, get: () => true})")
    page.wait_for_timeout(2500)
    assert polls == []
    # ... and once visible again it refreshes: the remaining jobs finished, the warning is gone.
    CleanupJob.objects.filter(state="pending").update(state="done", outcome="deleted", finished_at=timezone.now())
    page.evaluate("Object.defineProperty(document, 'hidden', {configurable: true, get: () => false})")
    page.wait_for_selector('[data-testid="forecast"][data-status="done"]', timeout=10_000)
    assert polls
    assert page.get_by_text("Will not finish before the next slot").count() == 0
