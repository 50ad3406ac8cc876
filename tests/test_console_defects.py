"""The defects a walk through the console and the admin found as a new user
of every role (issue 39, item 6), each with the test that shows it mended.
Browser-only ones (focus across a refresh, the reason kept across a CSRF
failure) are in ``test_console_defects_browser.py``."""

from __future__ import annotations

import pytest
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger

from . import tenant_world
from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store is healthy again, retrying"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def letter(portfolio, prop, active_policy) -> DeadLetter:  # type: ignore[no-untyped-def]
    """One open dead letter (the downstream answered 400)."""
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 2, ended=OLD)
    sweep_trigger()
    job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=reject)
    return DeadLetter.objects.get()


def logged_in(username: str, *roles: str, **client_options: bool) -> Client:
    client = Client(**client_options)
    client.force_login(make_user(username, *roles))
    return client


# --- 2. Error pages in the console's style ----------------------------------------------


def test_a_page_that_does_not_exist_answers_404_in_the_consoles_frame() -> None:
    client = logged_in("op", "operator")
    response = client.get("/console/jobs/999999/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="not-found"' in html and "console/console.css" in html
    assert 'data-testid="where-to-go"' in html  # where the viewer's roles do lead
    assert "<h1>Not Found</h1>" not in html  # Django's bare page


def test_a_404_for_someone_logged_out_offers_the_login_page(client: Client) -> None:
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert 'data-testid="not-found"' in response.content.decode()
    assert 'href="/accounts/login/"' in response.content.decode()


def test_a_failed_csrf_check_answers_403_in_the_consoles_frame_without_debug_advice(letter) -> None:
    client = logged_in("op", "operator", enforce_csrf_checks=True)
    client.get("/console/dead-letters/")  # the form's page: a CSRF cookie is set
    response = client.post(
        "/console/dead-letters/action/",
        {"letter": letter.pk, "operation": "redrive", "reason": REASON, "step": "review"},
        HTTP_REFERER="http://testserver/console/dead-letters/",
    )
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-csrf-failure="true"' in html and "console/console.css" in html
    assert "DEBUG" not in html
    # Back to a fresh copy of the form (a fresh token), where console.js puts the reason back.
    assert 'href="http://testserver/console/dead-letters/" data-testid="csrf-back"' in html
    assert 'id="csrf-draft"' in html
    # The server echoes nothing of the (possibly forged) body.
    assert REASON not in html
    letter.refresh_from_db()
    assert letter.status == DeadLetter.Status.OPEN


def test_a_csrf_failure_never_links_back_to_another_site(letter) -> None:
    client = logged_in("op", "operator", enforce_csrf_checks=True)
    response = client.post("/console/dead-letters/action/", {"reason": REASON}, HTTP_REFERER="https://evil.example/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "evil.example" not in html and 'href="/console/" data-testid="csrf-back"' in html


def test_the_500_page_renders_with_no_context_and_no_database_query(settings) -> None:
    from django.db import connection
    from django.test import RequestFactory
    from django.views.defaults import server_error

    settings.DEBUG = False
    with CaptureQueriesContext(connection) as queries:
        response = server_error(RequestFactory().get("/console/"))
    assert response.status_code == 500
    html = response.content.decode()
    assert 'data-testid="server-error"' in html and "console/console.css" in html
    assert "<h1>Server Error (500)</h1>" not in html
    assert len(queries) == 0


def test_a_view_that_raises_answers_the_consoles_500_page(settings) -> None:
    from unittest import mock

    client = logged_in("op", "operator", raise_request_exception=False)
    with mock.patch("cleanup_ops.views.workers.workers_overview", side_effect=RuntimeError("boom")):
        response = client.get("/console/workers/")
    assert response.status_code == 500
    assert 'data-testid="server-error"' in response.content.decode()


# --- 7. No row checkboxes without an action --------------------------------------------


def test_an_auditor_gets_no_row_checkboxes_on_the_dead_letter_inbox(letter) -> None:
    html = logged_in("audra", "auditor").get("/console/dead-letters/").content.decode()
    assert f'data-testid="letter-{letter.pk}"' in html
    assert 'type="checkbox"' not in html.split('id="live"', 1)[1]
    assert 'data-label="Select"' not in html


def test_an_operator_still_gets_a_checkbox_per_open_letter(letter) -> None:
    html = logged_in("op", "operator").get("/console/dead-letters/").content.decode()
    assert f'name="letter" value="{letter.pk}"' in html and 'data-testid="select-all-letters"' in html


# --- 3. The audit log links only where the viewer may go ---------------------------------


def hrefs(html: str) -> set[str]:
    import re

    return set(re.findall(r'href="(/console/[^"?#]+)"', html))


@pytest.fixture
def audited(letter, portfolio):  # type: ignore[no-untyped-def]
    """Audit events naming a portfolio (a pause: the object), a job and a
    letter (a redrive: the object and its details)."""
    from cleanup_ops.recovery.operator import dead_letter_redrive, pipeline_pause

    operator = make_user("op", "operator")
    pipeline_pause(actor=operator, portfolio_id=portfolio.pk, reason="quarterly audit of the estate")
    dead_letter_redrive(letter_id=letter.pk, actor=operator, reason=REASON)
    return {"letter": letter, "portfolio": portfolio}


@pytest.mark.parametrize("role", ["property_manager", "compliance_reviewer"])
def test_the_audit_log_names_portfolios_without_links_a_manager_or_reviewer_cannot_open(audited, role) -> None:
    from retention.services import membership_grant

    # A customer's manager or reviewer: a member of the portfolio in that role.
    reader = make_user("reader")
    membership_grant(user=reader, portfolio=audited["portfolio"], role=role, granted_by=None)
    client = Client()
    client.force_login(reader)
    html = client.get("/console/audit/").content.decode()
    assert "quarterly audit of the estate" in html  # the pause of Acme, an event of the reader's portfolio
    assert "Acme Lettings" in html  # named ...
    portfolio_page = f"/console/portfolios/{audited['portfolio'].pk}/"
    assert portfolio_page not in html  # ... not linked
    assert client.get(portfolio_page).status_code == 403  # the link would have been refused
    refused = {href: code for href in hrefs(html) if (code := client.get(href).status_code) != 200}
    assert refused == {}, refused


def test_the_audit_log_still_links_every_page_for_an_operator(audited) -> None:
    client = logged_in("reader", "operator")
    html = client.get("/console/audit/").content.decode()
    assert f'href="/console/portfolios/{audited["portfolio"].pk}/"' in html
    assert f'href="/console/dead-letters/{audited["letter"].pk}/"' in html
    assert {client.get(href).status_code for href in hrefs(html)} == {200}


world = tenant_world.world  # the fixture: Alder and Birch, each with its staff (tests/tenant_world.py)


def test_a_customer_members_audit_log_links_only_pages_that_open_for_them(world) -> None:  # type: ignore[no-untyped-def]
    for key in ("alder", "birch"):
        for role in tenant_world.ROLES:
            client = Client()
            client.force_login(tenant_world.member(world, key, role))
            html = client.get("/console/audit/").content.decode()
            refused = {href: code for href in hrefs(html) if (code := client.get(href).status_code) != 200}
            assert refused == {}, (key, role, refused)


# --- 4. The admin's login-log filters answer ---------------------------------------------


def filter_links(html: str) -> set[str]:
    import re

    return {link.replace("&amp;", "&") for link in re.findall(r'href="(\?[^"]+)"', html)}


@pytest.mark.parametrize("model", ["accesslog", "accessattempt", "accessfailurelog"])
def test_every_filter_link_of_the_admins_login_logs_answers_200(model: str) -> None:
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from django.utils import timezone

    seen = {"username": "op", "ip_address": "127.0.0.1", "user_agent": "x", "http_accept": "*/*"}
    AccessLog.objects.create(path_info="/accounts/login/", attempt_time=timezone.now(), **seen)
    AccessAttempt.objects.create(
        path_info="/admin/login/",
        attempt_time=timezone.now(),
        failures_since_start=1,
        get_data="",
        post_data="",
        **seen,
    )
    AccessFailureLog.objects.create(path_info="/admin/login/", attempt_time=timezone.now(), **seen)
    client = logged_in("op", "operator")  # operators see lockouts (retention.roles.LOCKOUT_VIEW)
    url = f"/admin/axes/{model}/"
    page = client.get(url)
    if page.status_code == 403:  # no view permission on this log: nothing to filter
        return
    links = filter_links(page.content.decode())
    if model == "accesslog":
        assert any(link.startswith("?path_info=") for link in links)  # the filter the walk found answering 400
    refused = {link: r.status_code for link in links if (r := client.get(url + link)).status_code != 200}
    assert refused == {}, refused


def test_the_admins_guard_still_refuses_a_parameter_no_filter_offers() -> None:
    client = logged_in("op", "operator")
    response = client.get("/admin/axes/accesslog/?user_agent=x")
    assert response.status_code == 400 and b"user_agent is not a filter of this list" in response.content


# --- 8. The forecast after a recovery: the recent throughput ---------------------------


def test_the_forecast_after_a_recovery_is_measured_from_the_first_finish_not_over_the_idle_window() -> None:
    from cleanup_ops.console_selectors import drain_forecast

    now = utc("2026-08-21T04:00:00Z")
    # Idle for 14 min (the store was down), then 30 jobs in the last minute: 70 remain, ~2.4 min of work.
    f = drain_forecast(
        now=now,
        started_at=utc("2026-08-21T02:00:00Z"),
        next_slot=utc("2026-08-22T02:00:00Z"),
        remaining=70,
        finished_recently=30,
        first_finished_at=utc("2026-08-21T03:59:00Z"),
    )
    assert f.rate_per_minute == 29  # the 29 after the first, in its minute; over 15 min it read 2/min
    assert f.eta_seconds is not None and f.eta_seconds == pytest.approx(70 / 29 * 60)
    assert f.window_seconds == 60 and f.status == "on_time"


def test_work_that_drains_in_seconds_is_forecast_in_seconds_not_still_measuring() -> None:
    from cleanup_ops.console_selectors import drain_forecast

    now = utc("2026-08-21T04:00:00Z")
    f = drain_forecast(
        now=now,
        started_at=utc("2026-08-21T02:00:00Z"),
        next_slot=utc("2026-08-22T02:00:00Z"),
        remaining=10,
        finished_recently=21,
        first_finished_at=utc("2026-08-21T03:59:40Z"),  # 20 finishes in the last 20 s
    )
    assert f.status == "on_time" and f.eta_seconds == pytest.approx(10.0)


def test_the_sweep_forecast_after_a_recovery_projects_seconds_for_seconds_of_work(portfolio, active_policy) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from cleanup_ops.console_selectors import sweep_forecast
    from cleanup_ops.models import Sweep, WorkerHeartbeat
    from properties.models import Property

    active_policy(portfolio, "lease", 365)
    for j in range(7):
        make_records(Property.objects.create(portfolio=portfolio, name=f"R{j}"), "lease", 1, ended=OLD)
    sweep = sweep_trigger().sweep
    now = timezone.now()
    Sweep.objects.filter(pk=sweep.pk).update(admitted_at=now - timedelta(minutes=30))
    jobs = list(CleanupJob.objects.filter(sweep=sweep).order_by("id"))
    # Nothing for the first 14.5 min of the window, then six jobs in 25 s; one job is left.
    for n, job in enumerate(jobs[:6]):
        CleanupJob.objects.filter(pk=job.pk).update(
            state="done", outcome="deleted", finished_at=now - timedelta(seconds=30 - 5 * n)
        )
    WorkerHeartbeat.objects.create(
        host="w1", cluster="default", pid=7, started_at=now - timedelta(hours=1), updated_at=now
    )
    f = sweep_forecast(Sweep.objects.get(pk=sweep.pk), now=now, portfolio_ids=None)
    assert (f.remaining, f.finished_in_window) == (1, 6)
    assert f.eta_seconds is not None and f.eta_seconds < 10  # 5 finishes in 30 s: 6 s; over 15 min it read 2.5 min


# --- 9. Retries by category during an incident -----------------------------------------


def test_retries_by_category_counts_an_incidents_failures_that_are_never_retried(portfolio, active_policy) -> None:
    from cleanup_ops.console_selectors.overview import current_sweep, retries_by_category
    from properties.models import Property

    active_policy(portfolio, "lease", 365)
    for j in range(4):
        make_records(Property.objects.create(portfolio=portfolio, name=f"I{j}"), "lease", 1, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))

    def unavailable(job_id: int) -> None:
        raise DownstreamError(503)

    def forbidden(job_id: int) -> None:
        raise DownstreamError(403)

    # The incident: the store refuses three jobs (4xx: never retried, each dead on its first
    # attempt) and is throttling the fourth (retried, backing off).
    for job in jobs[:3]:
        job_run_slice(job_id=job.pk, before_batch=forbidden)
    job_run_slice(job_id=jobs[3].pk, before_batch=unavailable)
    assert list(CleanupJob.objects.order_by("id").values_list("state", "attempt")) == [
        ("dead", 0),
        ("dead", 0),
        ("dead", 0),
        ("pending", 1),
    ]
    assert retries_by_category(sweep=current_sweep()) == {"downstream_rejected": 3, "downstream_throttled": 1}


def test_the_overviews_retries_chart_shows_the_incidents_categories(letter) -> None:
    html = logged_in("op", "operator").get("/console/").content.decode()
    chart = html.split('aria-label="failed attempts by category"', 1)[1].split("</svg>", 1)[0]
    assert "Downstream rejected (4xx): 1" in chart and "no data in this range" not in chart


# --- 10. A letter's advice names documents: the job page shows them --------------------


def test_a_purge_letters_advice_sends_the_operator_to_a_job_page_that_shows_its_documents_and_keys(
    portfolio, prop, active_policy, docstore, time_machine
) -> None:
    from django.urls import reverse

    from cleanup_ops.models import JobKind, JobOutcome, PurgeRequest
    from properties.models import Lease

    now = utc("2026-08-21T02:05:00Z")
    time_machine.move_to(now, tick=False)
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 3, ended=OLD)
    for record_id in ids:
        Lease.objects.filter(pk=record_id).update(document_id=f"doc-{record_id}")
    sweep_trigger(slot=utc("2026-08-21T02:00:00Z"), now=now)
    docstore.create(*[f"doc-{i}" for i in ids])
    assert job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE).pk).outcome == JobOutcome.DELETED
    docstore.set_faults(status=400)
    purge = CleanupJob.objects.get(job_kind=JobKind.PURGE)
    job_run_slice(job_id=purge.pk)
    letter = DeadLetter.objects.get()
    client = logged_in("op", "operator")
    advice = client.get(reverse("console:dead_letter", args=[letter.pk])).content.decode()
    assert "the job page shows the documents" in advice
    page = client.get(reverse("console:job", args=[purge.pk])).content.decode()
    shown = page.split('data-testid="job-documents"', 1)[1].split("</dd>", 1)[0]
    assert all(f"doc-{i}" in shown for i in ids)
    assert f"<code>{PurgeRequest.objects.get().key}:</code>" in shown  # the idempotency key the store logged


# --- 11. Search: record kind, HTTP status, document id ---------------------------------


def test_search_finds_jobs_and_letters_by_record_kind_and_letters_by_http_status(portfolio, active_policy) -> None:
    from properties.models import Property

    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    prop = Property.objects.create(portfolio=portfolio, name="Quay Court")
    make_records(prop, "lease", 1, ended=OLD)
    make_records(prop, "maintenance_record", 1, ended=OLD)
    sweep_trigger()
    lease_job = CleanupJob.objects.get(record_kind="lease")
    maintenance_job = CleanupJob.objects.get(record_kind="maintenance_record")

    def forbidden(job_id: int) -> None:
        raise DownstreamError(403)

    job_run_slice(job_id=lease_job.pk, before_batch=forbidden)
    letter = DeadLetter.objects.get()
    client = logged_in("op", "operator")
    found = client.get("/console/search/?q=maintenance").content.decode()
    assert f'data-testid="search-job-{maintenance_job.pk}"' in found
    assert f'data-testid="search-job-{lease_job.pk}"' not in found
    by_label = client.get("/console/search/?q=Lease").content.decode()  # the kind's label, any case
    assert f'data-testid="search-letter-{letter.pk}"' in by_label
    by_status = client.get("/console/search/?q=403").content.decode()
    assert f'data-testid="search-letter-{letter.pk}"' in by_status
    assert f'data-testid="search-letter-{letter.pk}"' not in client.get("/console/search/?q=404").content.decode()


def test_search_finds_a_purge_job_and_its_letter_by_a_document_id(
    portfolio, prop, active_policy, docstore, time_machine
) -> None:
    from cleanup_ops.models import JobKind
    from properties.models import Lease

    now = utc("2026-08-21T02:05:00Z")
    time_machine.move_to(now, tick=False)
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 2, ended=OLD)
    for record_id in ids:
        Lease.objects.filter(pk=record_id).update(document_id=f"scan-{record_id}")
    sweep_trigger(slot=utc("2026-08-21T02:00:00Z"), now=now)
    docstore.create(*[f"scan-{i}" for i in ids])
    job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE).pk)
    docstore.set_faults(status=400)
    purge = CleanupJob.objects.get(job_kind=JobKind.PURGE)
    job_run_slice(job_id=purge.pk)
    letter = DeadLetter.objects.get()
    found = logged_in("op", "operator").get(f"/console/search/?q=scan-{ids[1]}").content.decode()
    assert f'data-testid="search-job-{purge.pk}"' in found
    assert f'data-testid="search-letter-{letter.pk}"' in found


# --- 12. Copy: plurals, "under a second", the operating guide's paragraphs ------------


def test_the_ticked_jobs_confirmation_says_cancel_2_jobs_beside_a_back_link_not_beside_cancel(portfolio, active_policy):  # type: ignore[no-untyped-def]
    from properties.models import Property

    active_policy(portfolio, "lease", 365)
    for j in range(2):
        make_records(Property.objects.create(portfolio=portfolio, name=f"C{j}"), "lease", 1, ended=OLD)
    sweep_trigger()
    ids = list(CleanupJob.objects.values_list("id", flat=True))
    page = logged_in("op", "operator").post(
        "/console/jobs/selected/", {"operation": "cancel", "job": ids, "reason": REASON, "next": "/console/jobs/"}
    )
    html = page.content.decode()
    assert "Cancel 2 ticked jobs?" in html
    assert '>Cancel 2 jobs</button> <a href="/console/jobs/" data-testid="jobs-selected-back">Back to the jobs' in html
    assert "job(s)" not in html and ">Cancel</a>" not in html


def test_the_impact_preview_says_under_a_second_never_about_0_s() -> None:
    from retention.selectors import ImpactPreview

    def preview(rows: int, rate: float | None) -> str | None:
        return ImpactPreview(
            active_days=30,
            active_enabled=True,
            proposed_days=10,
            proposed_enabled=True,
            expired_now=0,
            held_now=0,
            expired_after=rows,
            held_after=0,
            rows_per_second=rate,
        ).time_after_text

    assert preview(3, 5000.0) == "under a second"
    assert preview(200, 5.0) == "about 40 s"
    assert preview(1800, 5.0) == "about 6 min"
    assert preview(36_000, 5.0) == "about 2 h"
    assert preview(3, None) is None


def paragraph_slips(text: str) -> list[str]:
    """Lines that break into a list item's paragraph (an unindented line right
    after an indented continuation) or that start a paragraph mid-sentence
    (indented by one space, in lower case), outside code fences."""
    import re

    slips: list[str] = []
    fence, prev, prev_blank = False, "", True
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence, prev, prev_blank = not fence, line, False
            continue
        if fence:
            continue
        blank = not line.strip()
        if not blank and prev_blank and re.match(r"^ [a-z]", line):
            slips.append(line)
        in_item = prev.startswith("  ") or bool(re.match(r"^([-*]|\d+\.) ", prev))
        if not blank and not prev_blank and in_item and not line.startswith((" ", "-", "|", "#", "*")):
            slips.append(line)
        prev, prev_blank = line, blank
    return slips


@pytest.mark.parametrize("doc", ["docs/operating.md", "docs/developing.md"])
def test_the_guides_have_no_paragraph_broken_into_another(doc: str) -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / doc).read_text()
    assert paragraph_slips(text) == []
    if doc == "docs/operating.md":
        assert "is *carried over*,\n  not admitted twice" in text


# --- 6. Times with their zone, in the viewer's zone, console and admin alike -----------


@pytest.fixture
def hold(portfolio, prop, time_machine):  # type: ignore[no-untyped-def]
    from retention.services import legal_hold_place

    time_machine.move_to("2026-01-15T12:34:00Z", tick=False)
    reviewer = make_user("rev", "compliance_reviewer")
    ids = make_records(prop, "lease", 1, ended=OLD)
    return legal_hold_place(
        portfolio=portfolio, record_kind="lease", record_id=ids[0], placed_by=reviewer, reason="litigation hold, x"
    )


def test_the_admin_names_the_zone_of_its_times_utc_without_the_viewers_zone(hold) -> None:
    html = logged_in("viewer", "compliance_reviewer").get("/admin/retention/legalhold/").content.decode()
    assert "2026-01-15 12:34 UTC" in html


def test_the_admin_shows_times_in_the_viewers_zone_from_the_browsers_cookie(hold) -> None:
    client = logged_in("viewer", "compliance_reviewer")
    client.cookies["viewer_zone"] = "America/New_York"
    html = client.get("/admin/retention/legalhold/").content.decode()
    assert "2026-01-15 07:34 EST" in html and "12:34 UTC" not in html
    # The hold's own page, too (a read-only field).
    assert "2026-01-15 07:34 EST" in client.get(f"/admin/retention/legalhold/{hold.pk}/change/").content.decode()


def test_a_zone_cookie_that_is_no_iana_zone_is_ignored(hold) -> None:
    client = logged_in("viewer", "compliance_reviewer")
    for bogus in ("../../etc/passwd", "Mars/Olympus", "x" * 200):
        client.cookies["viewer_zone"] = bogus
        assert "2026-01-15 12:34 UTC" in client.get("/admin/retention/legalhold/").content.decode()


def test_the_throughput_axis_is_labelled_in_the_viewers_zone_and_names_it(letter, time_machine) -> None:
    time_machine.move_to("2026-01-15T12:34:00Z", tick=False)
    client = logged_in("op", "operator")
    utc_axis = client.get("/console/").content.decode()
    assert "UTC, last 12 h" in utc_axis and ">12h<" in utc_axis
    client.cookies["viewer_zone"] = "Asia/Kolkata"  # UTC+05:30: the half hour shows
    local = client.get("/console/").content.decode()
    assert "Asia/Kolkata, last 12 h" in local and "UTC, last 12 h" not in local
    assert ">17:30<" in local  # the bar of 12:00 UTC
