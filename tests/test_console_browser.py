"""The operator console in a real browser (headless Chromium via Playwright).

Runs against pytest-django's ``live_server`` (real HTTP on 127.0.0.1), so the
login form, CSRF tokens, the two-step dead-letter confirmation, redirects and
flash messages are exercised end to end, as an operator sees them.

Needs Debian's ``chromium`` at /usr/bin/chromium (``playwright install`` is not
used). Without it the tests are skipped with a reason; CI installs it and fails
on any skip.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobState
from cleanup_ops.recovery.classification import DownstreamError, FailureCategory
from cleanup_ops.schedule import sweep_trigger
from retention.models import AuditEvent

from .conftest import make_records, make_user, utc

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
REASON = "downstream store fixed the 400, retrying"
OLD = utc("2020-01-01T00:00:00Z")

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium); CI installs it",
    ),
    pytest.mark.django_db(transaction=True),  # live_server serves from another thread
]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
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


@pytest.fixture
def page(browser, live_server):  # type: ignore[no-untyped-def]
    # pytest-django names the server ``localhost``; talk to it as 127.0.0.1 and
    # refuse every request that would go anywhere else.
    origin = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    context = browser.new_context(base_url=origin)
    context.route(re.compile(rf"^(?!{re.escape(origin)}/).*"), lambda route: route.abort())
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


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


def log_in(page, username: str) -> None:  # type: ignore[no-untyped-def]
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/console/")
    assert page.locator("header").get_by_text(username).is_visible()


def test_an_operator_redrives_a_dead_letter_with_a_reason_and_finds_it_in_the_audit_log(
    page, dead_letter, tmp_path: Path
) -> None:
    make_user("op", "operator")
    old_job = dead_letter.job
    log_in(page, "op")

    page.get_by_role("link", name="Dead letters").click()
    page.wait_for_url("**/console/dead-letters/")
    row = page.get_by_test_id(f"letter-{dead_letter.pk}")
    assert "downstream_rejected" in row.inner_text()

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
    assert page.get_by_role("heading", name="Redrive 1 dead letter(s)?").is_visible()
    assert REASON in page.locator("main").inner_text()
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetter.Status.OPEN  # nothing applied before the confirmation
    page.get_by_role("button", name="Confirm redrive").click()
    page.wait_for_url("**/console/dead-letters/")

    new_job = CleanupJob.objects.get(redrive_of=old_job)
    message = page.get_by_test_id("message").inner_text()
    assert message == f"Redrove 1 dead letter(s): new job(s) {new_job.pk}."
    dead_letter.refresh_from_db()
    assert (dead_letter.status, dead_letter.redrive_job_id) == (DeadLetter.Status.REDRIVEN, new_job.pk)
    assert dead_letter.resolved_by.username == "op"
    assert new_job.key == f"{old_job.key}:redrive:1"
    assert new_job.state != JobState.DEAD
    event = AuditEvent.objects.get(action="dead_letter.redriven")
    assert (event.reason, event.actor.username) == (REASON, "op")
    assert page.get_by_test_id(f"letter-{dead_letter.pk}").count() == 0  # no longer in the open inbox

    page.get_by_role("link", name="Audit log").click()
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

    assert page.get_by_test_id("pipeline-state").inner_text() == "Pipeline running"
    assert page.locator('svg[aria-label="rows deleted per hour"]').is_visible()
    assert page.locator('svg[aria-label="failed attempts by category"]').is_visible()
    assert page.get_by_role("heading", name="Retention debt").is_visible()
    assert page.get_by_role("button", name="Apply").count() == 0  # no pause form either

    page.get_by_role("link", name="Dead letters").click()
    page.wait_for_url("**/console/dead-letters/")
    assert page.get_by_test_id(f"letter-{dead_letter.pk}").is_visible()
    assert page.get_by_label("operation").count() == 0
    assert page.get_by_label("reason").count() == 0
    assert page.get_by_role("button", name="Review…").count() == 0
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetter.Status.OPEN
