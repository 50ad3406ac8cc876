"""Issue 30: the console's figures and decisions after an incident — items
3, 5, 7, 8, 9, 10, 11 and 13 (the browser walks are in
``test_console_recovery_browser.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cleanup_ops.console_selectors import JobFilter
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import JobAction, jobs_act, pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent, Membership

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

NOW = utc("2026-08-21T02:30:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "Birch and Acme: the store is back after the outage"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def world(portfolio, active_policy, time_machine):  # type: ignore[no-untyped-def]
    """Acme (two partitions) and Birch (one), every delete job dead-lettered by a store that answered 400."""
    time_machine.move_to(NOW, tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for name in ("Harbour House", "Quay Court"):
        make_records(Property.objects.create(portfolio=portfolio, name=name), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="Birch Row"), "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    for job in jobs:
        job_run_slice(job_id=job.pk, before_batch=reject)
    assert DeadLetter.objects.filter(status="open").count() == 3
    return {"acme": portfolio, "birch": birch, "jobs": jobs, "sweep": Sweep.objects.get()}


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def customer_auditor(portfolio: Portfolio, name: str) -> Client:
    user = make_user(name)
    Membership.objects.create(user=user, portfolio=portfolio, role="auditor")
    client = Client()
    client.force_login(user)
    return client


def decide_one(op: Client, letter: DeadLetter, operation: str, reason: str) -> None:
    response = op.post(
        "/console/dead-letters/action/",
        {"operation": operation, "letter": letter.pk, "reason": reason, "confirm": "yes"},
    )
    assert response.status_code == 302


def bulk_confirm(op: Client, path: str, query: dict[str, str]) -> dict[str, str]:
    """The confirmation page's form, as the browser would send it."""
    page = op.get(path, query)
    assert page.status_code == 200
    return {**query, "confirm": "yes", "expected": str(page.context["count"]), "seen": page.context["seen"]}


# --- Item 5 ---------------------------------------------------------------------------


def test_a_bulk_redrive_over_two_customers_shows_neither_customer_the_operators_reason(world, op):
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "redrive"})
    assert op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON}).status_code == 302
    assert DeadLetter.objects.filter(status="redriven").count() == 3
    acme_auditor = customer_auditor(world["acme"], "aud-acme")
    api_user = make_user("aud-acme-api")
    Membership.objects.create(user=api_user, portfolio=world["acme"], role="auditor")
    api = APIClient()
    api.force_authenticate(api_user)
    for letter in DeadLetter.objects.filter(portfolio_id=world["acme"].pk):
        assert REASON not in letter.resolution_reason
        assert "covering 2 portfolios" in letter.resolution_reason
        for path in (f"/console/dead-letters/{letter.pk}/", f"/console/jobs/{letter.job_id}/"):
            body = acme_auditor.get(path).content.decode()
            assert REASON not in body and "Birch" not in body, path
        assert REASON not in api.get(f"/api/v1/dead-letters/{letter.pk}/").content.decode()
    # The platform keeps the words, once, where only platform roles read them.
    spanning = AuditEvent.objects.get(action="dead_letters.redriven")
    assert spanning.reason == REASON and "portfolio_id" not in spanning.details
    assert REASON in op.get("/console/audit/").content.decode()


def test_a_bulk_run_now_over_two_customers_keeps_the_reason_out_of_each_customers_job_events(world, op):
    # Pending work in both customers: the letters redriven one by one (each decision within one portfolio).
    for letter in DeadLetter.objects.order_by("id"):
        decide_one(op, letter, "redrive", "one at a time, own portfolio")
    assert CleanupJob.objects.filter(state="pending").count() == 3
    form = bulk_confirm(op, "/console/jobs/all-matching/", {"operation": "run_now"})
    assert op.post("/console/jobs/all-matching/", {**form, "reason": REASON}).status_code == 302
    events = AuditEvent.objects.filter(action="job.run_now")
    assert events.count() == 3 and not events.filter(reason=REASON).exists()
    assert AuditEvent.objects.get(action="jobs.run_now").reason == REASON
    body = customer_auditor(world["birch"], "aud-birch").get("/console/audit/").content.decode()
    assert "job.run_now" in body or "Run now" in body
    assert REASON not in body


def test_a_decision_within_one_portfolio_keeps_its_reason_on_the_letter(world, op):
    acme = str(world["acme"].pk)
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "dismiss", "portfolio": acme})
    op.post("/console/dead-letters/all-matching/", {**form, "reason": "Acme asked us to drop these"})
    assert set(DeadLetter.objects.filter(status="dismissed").values_list("resolution_reason", flat=True)) == {
        "Acme asked us to drop these"
    }
    assert not AuditEvent.objects.filter(action="dead_letters.dismissed").exists()


# --- Item 9 ---------------------------------------------------------------------------


def test_the_job_page_counts_the_failed_attempt_its_dead_letter_counts(world, op):
    job = world["jobs"][0]
    body = op.get(f"/console/jobs/{job.pk}/").content.decode()
    assert "after 1 failed attempt" in body
    assert "0 failed" not in body
    assert 'data-testid="job-attempts">1 failed' in body


# --- Item 13 --------------------------------------------------------------------------


def test_a_letter_that_appeared_after_the_confirmation_was_shown_is_not_decided(world, op):
    acme = str(world["acme"].pk)
    first, second = DeadLetter.objects.filter(portfolio_id=world["acme"].pk).order_by("id")
    decide_one(op, first, "redrive", "the store is back, retry")
    retried = CleanupJob.objects.get(redrive_of_id=first.job_id)
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "dismiss", "portfolio": acme})
    assert form["expected"] == "1"  # the page shows the second letter
    # Meanwhile the shown letter is decided elsewhere, and a new one appears: the count is 1 again.
    decide_one(op, second, "dismiss", "decided elsewhere first")
    jobs_act(
        action=JobAction.CANCEL,
        actor=None,
        reason="cancelled from the shell",
        job_filter=JobFilter(job_ids=(retried.pk,)),
    )
    newcomer = DeadLetter.objects.get(job=retried)
    response = op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON})
    assert response.status_code == 400
    assert "changed since the page was shown" in response.content.decode()
    assert DeadLetter.objects.get(pk=newcomer.pk).status == "open"


def test_a_job_that_became_pending_after_the_confirmation_was_shown_is_not_run(world, op):
    letters = list(DeadLetter.objects.order_by("id"))
    for letter in letters[:2]:
        decide_one(op, letter, "redrive", "the store is back, retry")
    form = bulk_confirm(op, "/console/jobs/all-matching/", {"operation": "run_now"})
    assert form["expected"] == "2"
    first = CleanupJob.objects.filter(state="pending").order_by("id").first()
    CleanupJob.objects.filter(pk=first.pk).update(state="done", finished_at=NOW)  # a worker finished it
    decide_one(op, letters[2], "redrive", "the store is back, retry")
    response = op.post("/console/jobs/all-matching/", {**form, "reason": REASON})
    assert response.status_code == 400 and "changed since the page was shown" in response.content.decode()
    assert not AuditEvent.objects.filter(action="job.run_now").exists()


def test_a_confirmation_without_the_shown_selection_asks_again(world, op):
    response = op.post(
        "/console/dead-letters/all-matching/",
        {"operation": "dismiss", "confirm": "yes", "expected": "3", "reason": REASON},
    )
    assert response.status_code == 400 and DeadLetter.objects.filter(status="open").count() == 3


# --- Item 7 ---------------------------------------------------------------------------


def a_live_cluster(queue: str = "") -> WorkerHeartbeat:
    return WorkerHeartbeat.objects.create(
        host="worker-1",
        cluster=queue or "default",
        queue=queue,
        pid=7,
        started_at=NOW - timedelta(hours=1),
        last_progress_at=NOW - timedelta(seconds=30),
        updated_at=NOW - timedelta(seconds=30),
    )


def test_run_now_on_a_paused_portfolios_jobs_says_they_wait_for_the_resume_and_rows_say_paused(world, op):
    a_live_cluster()
    for letter in DeadLetter.objects.order_by("id"):
        decide_one(op, letter, "redrive", "the store is back, retry")
    pipeline_pause(actor=None, reason="Birch asked us to wait", portfolio_id=world["birch"].pk)
    birch_job = CleanupJob.objects.get(portfolio_id=world["birch"].pk, state="pending")
    response = op.post(f"/console/jobs/{birch_job.pk}/action/", {"operation": "run_now", "reason": REASON}, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert not any("as soon as a worker takes them" in m for m in said), said
    assert any("will not run while portfolio Birch Estates is paused (Birch asked us to wait)" in m for m in said)
    page = op.get(f"/console/jobs/{birch_job.pk}/").content.decode()
    assert 'data-testid="job-paused"' in page
    rows = op.get("/console/jobs/?state=pending").content.decode()
    assert rows.count('data-testid="job-paused"') == 1  # Birch's job; Acme's two are not paused
    form = bulk_confirm(op, "/console/jobs/all-matching/", {"operation": "run_now"})
    done = op.post("/console/jobs/all-matching/", {**form, "reason": REASON}, follow=True)
    said = [str(m) for m in done.context["messages"]]
    assert "3 jobs are due now. 2 of them run as soon as a worker takes them." in said
    assert any("1 of these jobs will not run while portfolio Birch Estates is paused" in m for m in said)


# --- Item 8 ---------------------------------------------------------------------------


def test_after_a_successful_redrive_the_sweep_the_state_cards_and_the_completion_recover(world, op):
    before = op.get("/console/").content.decode()
    assert "Drained with dead letters" in before and 'data-testid="completion">0%' in before
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "redrive"})
    op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON})
    for job in CleanupJob.objects.filter(redrive_of__isnull=False):
        job_run_slice(job_id=job.pk)
    sweep = Sweep.objects.get()
    assert sweep.status == Sweep.Status.DRAINED
    page = op.get("/console/").content.decode()
    assert "Drained with dead letters" not in page
    assert 'data-testid="jobs-dead">0<' in page and "3 more redriven" in page
    assert 'data-testid="completion">100%' in page
    assert 'data-testid="letters-open">0<' in page
    assert "3 new and 3 decided in the last day" in page and "+3" not in page
    assert "3/3 jobs finished" in page
    sweeps = op.get("/console/sweeps/").content.decode()
    assert "Drained with dead letters" not in sweeps
    # A customer's staff see the same recovery in their own figures.
    acme = customer_auditor(world["acme"], "aud-acme").get("/console/sweeps/").content.decode()
    assert "Drained with dead letters" not in acme and "Drained" in acme


def test_a_redrive_that_fails_again_keeps_the_sweep_drained_with_dead_letters(world, op):
    letter = DeadLetter.objects.order_by("id").first()
    decide_one(op, letter, "redrive", "the store is back, retry")
    job_run_slice(job_id=CleanupJob.objects.get(redrive_of_id=letter.job_id).pk, before_batch=reject)
    assert Sweep.objects.get().status == Sweep.Status.DRAINED_WITH_DEAD_LETTERS


# --- Item 10 --------------------------------------------------------------------------


def test_retention_debt_is_not_missed_minutes_after_a_legitimate_shortening(
    portfolio, prop, manager, reviewer, time_machine, operator_user
):
    from cleanup_ops.console_selectors.overview import retention_debt
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    time_machine.move_to(utc("2026-07-01T00:00:00Z"), tick=False)
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    first = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="one year for leases")
    policy_version_approve(version_id=first.pk, reviewer=reviewer, note="agreed with legal, one year")
    time_machine.move_to(NOW, tick=False)
    make_records(prop, "lease", 5, ended=NOW - timedelta(days=200))  # eligible only under the shorter period
    shorter = policy_version_submit(policy=policy, retention_days=100, author=manager, reason="minimise: 100 days")
    policy_version_approve(version_id=shorter.pk, reviewer=reviewer, note="checked the impact, agreed")

    time_machine.move_to(NOW + timedelta(minutes=5), tick=False)
    lease = next(row for row in retention_debt(now=NOW + timedelta(minutes=5)) if row["record_kind"] == "lease")
    assert (lease["overdue"], lease["overdue_beyond_grace"], lease["target_met"]) == (5, 0, True)
    page = Client()
    page.force_login(operator_user)
    assert "MISSED" not in page.get("/console/").content.decode()

    # A day and more later, with no sweep having run, they are late.
    later = NOW + timedelta(hours=25)
    time_machine.move_to(later, tick=False)
    lease = next(row for row in retention_debt(now=later) if row["record_kind"] == "lease")
    assert (lease["overdue_beyond_grace"], lease["target_met"]) == (5, False)


def test_records_already_late_under_the_previous_period_stay_late_after_a_shortening(
    portfolio, prop, manager, reviewer, time_machine
):
    from cleanup_ops.console_selectors.overview import retention_debt
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    time_machine.move_to(utc("2026-07-01T00:00:00Z"), tick=False)
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    first = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="one year for leases")
    policy_version_approve(version_id=first.pk, reviewer=reviewer, note="agreed with legal, one year")
    time_machine.move_to(NOW, tick=False)
    make_records(prop, "lease", 2, ended=NOW - timedelta(days=400))  # late under the year already
    make_records(prop, "lease", 3, ended=NOW - timedelta(days=200))
    shorter = policy_version_submit(policy=policy, retention_days=100, author=manager, reason="minimise: 100 days")
    policy_version_approve(version_id=shorter.pk, reviewer=reviewer, note="checked the impact, agreed")
    lease = next(row for row in retention_debt(now=NOW) if row["record_kind"] == "lease")
    assert (lease["overdue"], lease["overdue_beyond_grace"]) == (5, 2)


# --- Item 11 --------------------------------------------------------------------------


def test_the_overview_during_the_incident_is_not_a_green_running_banner_and_shows_the_workers(world, op):
    for letter in DeadLetter.objects.order_by("id")[:2]:
        decide_one(op, letter, "redrive", "the store is back, retry")
    pipeline_pause(actor=None, reason="Birch asked us to wait", portfolio_id=world["birch"].pk)
    page = op.get("/console/").content.decode()
    assert "Pipeline running" not in page
    assert "Pipeline not paused, but it needs an operator" in page
    assert "2 open jobs (delete) have no worker" in page and "1 dead letter waits for a decision" in page
    # "none" beside "oldest due job" read as "no worker": it says the jobs cannot run.
    assert 'data-testid="oldest-due">none can run<' in page
    assert 'data-testid="workers-card"' in page
    assert "none reporting — start one: <code>python manage.py qcluster</code>" in page


def test_the_overview_reads_running_once_a_cluster_serves_the_work_and_no_letter_waits(world, op):
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "redrive"})
    op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON})
    a_live_cluster()
    a_live_cluster("retention-purge")
    page = op.get("/console/").content.decode()
    assert 'data-testid="pipeline-state">Pipeline running<' in page
    assert "1 reporting" in page and "none reporting" not in page


def test_the_workers_page_says_how_to_start_a_cluster_for_each_queue(world, op):
    """Item 2: nothing on screen said a purge cluster, DOCSTORE_URL or distinct names were needed."""
    page = op.get("/console/workers/").content.decode()
    assert "<code>python manage.py qcluster</code>" in page
    assert (
        "<code>Q_CLUSTER_NAME=retention-purge DOCSTORE_URL=&lt;the document store&gt; python manage.py qcluster</code>"
        in page
    )
    assert "<code>purge</code> for the purge queue" in page
