"""The console under incidents: figures that count only work that can run,
actions on any job (run now, cancel), search, names instead of ids, the
audit log's filters, landing pages, and the decision flow that keeps what
the operator typed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cleanup_ops.console_selectors import JobFilter
from cleanup_ops.console_selectors.waiting import open_work
from cleanup_ops.console_selectors.workers import live_job_kinds
from cleanup_ops.dispatch import queues
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, PurgeRequest, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError, FailureCategory
from cleanup_ops.recovery.operator import (
    JobAction,
    dead_letter_redrive,
    jobs_act,
    pipeline_pause,
)
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent, Membership

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

NOW = utc("2026-08-21T02:30:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "the document store is back, run it now"


@pytest.fixture
def world(portfolio, active_policy, time_machine):  # type: ignore[no-untyped-def]
    """Acme (three partitions) and Birch (one), a sweep admitted at NOW, every job pending and due."""
    time_machine.move_to(NOW, tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for name in ("Harbour House", "Quay Court", "Mill Lane"):
        make_records(Property.objects.create(portfolio=portfolio, name=name), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="Birch Row"), "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    assert len(jobs) == 4
    return {"acme": portfolio, "birch": birch, "jobs": jobs}


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def a_live_cluster(queue: str = "", *, at=NOW) -> WorkerHeartbeat:  # type: ignore[no-untyped-def]
    return WorkerHeartbeat.objects.create(
        host=f"worker-{queue or 'main'}",
        cluster=f"c-{queue or 'main'}",
        queue=queue,
        pid=7,
        started_at=at - timedelta(hours=1),
        last_progress_at=at - timedelta(seconds=30),
        updated_at=at - timedelta(seconds=30),
    )


def backing_off(job: CleanupJob) -> CleanupJob:
    CleanupJob.objects.filter(pk=job.pk).update(
        attempt=1, last_error_category="downstream_unavailable", available_at=NOW + timedelta(minutes=5)
    )
    job.refresh_from_db()
    return job


# --- What the open work waits for ----------------------------------------------------


def test_each_open_job_is_counted_once_paused_without_a_worker_running_backing_off_rate_limited_or_due(world):
    acme_jobs = [j for j in world["jobs"] if j.portfolio_id == world["acme"].pk]
    backing_off(acme_jobs[0])
    CleanupJob.objects.filter(pk=acme_jobs[1].pk).update(available_at=NOW + timedelta(seconds=20))  # deferred
    CleanupJob.objects.filter(pk=acme_jobs[2].pk).update(
        state="leased", lease_owner="w:1", lease_expires_at=NOW + timedelta(seconds=30)
    )
    pipeline_pause(actor=None, reason="birch asked us to wait", portfolio_id=world["birch"].pk)
    live = live_job_kinds(now=NOW, queues=queues())
    assert live == set()  # no cluster has ever reported
    nobody = open_work(now=NOW, portfolio_ids=None, live_kinds=live)
    assert (nobody.open, nobody.paused, nobody.no_worker, nobody.due) == (4, 1, 3, 0)
    assert nobody.kinds_without_worker == [JobKind.DELETE]
    a_live_cluster()
    live = live_job_kinds(now=NOW, queues=queues())
    assert JobKind.DELETE in live
    work = open_work(now=NOW, portfolio_ids=None, live_kinds=live)
    assert (work.paused, work.no_worker, work.running, work.backing_off, work.rate_limited, work.due) == (
        1,
        0,
        1,
        1,
        1,
        0,
    )
    assert work.runnable == 3 and work.blocked == 1
    assert [(p["name"], p["reason"], p["jobs"]) for p in work.pauses] == [
        ("Birch Estates", "birch asked us to wait", 1)
    ]


def test_a_sweep_whose_open_jobs_are_all_paused_is_forecast_blocked_naming_the_pause_not_on_track(world, op):
    a_live_cluster()
    pipeline_pause(actor=None, reason="month-end freeze for Acme", portfolio_id=world["acme"].pk)
    pipeline_pause(actor=None, reason="birch asked us to wait", portfolio_id=world["birch"].pk)
    body = op.get("/console/").content.decode()
    assert 'data-testid="forecast" data-status="blocked"' in body
    assert "none of the 4 open jobs can run" in body
    assert "month-end freeze for Acme" in body and "Acme Lettings" in body
    assert "On track" not in body
    # The oldest due job is not "waiting for a worker": nothing that can run is due.
    assert 'data-testid="oldest-due">none can run<' in body
    assert "4 paused" in body


def test_work_of_a_queue_without_a_live_cluster_waits_for_a_worker_and_is_said_so(world, op):
    a_live_cluster(at=NOW - timedelta(hours=2))  # reported two hours ago: not live
    body = op.get("/console/").content.decode()
    assert 'data-status="blocked"' in body
    assert "wait for a worker: no cluster serving their queue has reported in the last 2 min" in body


def test_the_oldest_due_job_counts_only_jobs_that_can_run(world, op, time_machine):
    a_live_cluster(at=NOW + timedelta(minutes=10))
    pipeline_pause(actor=None, reason="birch asked us to wait", portfolio_id=world["birch"].pk)
    time_machine.move_to(NOW + timedelta(minutes=10), tick=False)
    response = op.get("/console/")
    assert response.context["work"].due == 3
    assert response.context["oldest_due_age_seconds"] == 600.0
    assert "3 jobs that can run wait for a worker" in response.content.decode()


# --- Run now and cancel ----------------------------------------------------------------


def test_run_now_makes_a_backing_off_job_due_and_leaves_an_audit_event(world, op, operator_user):
    job = backing_off(world["jobs"][0])
    CleanupJob.objects.filter(pk=job.pk).update(enqueued_at=NOW + timedelta(minutes=5))  # a hint for later
    response = op.post(f"/console/jobs/{job.pk}/action/", {"operation": "run_now", "reason": REASON}, follow=True)
    assert "1 job is due now" in response.content.decode()
    job.refresh_from_db()
    assert (job.available_at, job.enqueued_at, job.attempt, job.state) == (NOW, None, 1, "pending")
    event = AuditEvent.objects.get(action="job.run_now")
    assert (event.object_type, event.object_id, event.actor, event.reason) == (
        "job",
        str(job.pk),
        operator_user,
        REASON,
    )
    assert event.details == {"sweep_id": job.sweep_id, "portfolio_id": job.portfolio_id}


def test_cancel_turns_a_pending_job_into_a_cancelled_dead_letter_that_can_be_redriven(world, op):
    job = backing_off(world["jobs"][0])
    op.post(f"/console/jobs/{job.pk}/action/", {"operation": "cancel", "reason": REASON})
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.state, job.last_error_category) == ("dead", FailureCategory.CANCELLED)
    assert (letter.category, letter.status, letter.failed_attempts) == ("cancelled", "open", 1)
    event = AuditEvent.objects.get(action="job.cancelled")
    assert event.details["letter_id"] == letter.pk and event.details["category"] == "cancelled"
    again = dead_letter_redrive(letter_id=letter.pk, actor=None, reason="cancelled by mistake, redo")
    assert (again.state, again.cursor, again.redrive_of_id) == ("pending", job.cursor, job.pk)


def test_cancelling_the_last_open_job_of_a_sweep_finishes_the_sweep(world, op):
    for job in world["jobs"][1:]:
        job_run_slice(job_id=job.pk)
    last = world["jobs"][0]
    op.post(f"/console/jobs/{last.pk}/action/", {"operation": "cancel", "reason": REASON})
    last.sweep.refresh_from_db()
    assert last.sweep.status == "drained_with_dead_letters"


def test_a_job_action_with_a_short_reason_is_a_400_that_keeps_the_reason_and_changes_nothing(world, op):
    job = backing_off(world["jobs"][0])
    response = op.post(f"/console/jobs/{job.pk}/action/", {"operation": "cancel", "reason": "too short"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "at least 10 characters" in body and 'value="too short"' in body
    assert '<option value="cancel" selected>' in body
    job.refresh_from_db()
    assert job.state == "pending" and not AuditEvent.objects.filter(object_type="job").exists()
    bad = op.post(f"/console/jobs/{job.pk}/action/", {"operation": "explode", "reason": REASON})
    assert bad.status_code == 400 and b"operation" in bad.content


def test_a_job_no_longer_pending_is_left_as_it_is(world, op):
    job = world["jobs"][0]
    job_run_slice(job_id=job.pk)
    response = op.post(f"/console/jobs/{job.pk}/action/", {"operation": "run_now", "reason": REASON})
    assert response.status_code == 400 and "not pending" in response.content.decode()
    assert not AuditEvent.objects.filter(object_type="job").exists()


def test_bulk_run_now_acts_on_every_pending_job_matching_and_asks_again_when_the_count_changed(world, op):
    acme = world["acme"].pk
    shown = op.get(f"/console/jobs/all-matching/?operation=run_now&portfolio={acme}")
    assert shown.status_code == 200 and shown.context["count"] == 3
    form = {
        "operation": "run_now",
        "portfolio": acme,
        "confirm": "yes",
        "reason": REASON,
        "seen": shown.context["seen"],
    }
    stale = op.post("/console/jobs/all-matching/", {**form, "expected": 2})
    assert stale.status_code == 400 and "changed from 2 to 3" in stale.content.decode()
    assert not AuditEvent.objects.filter(action="job.run_now").exists()
    done = op.post("/console/jobs/all-matching/", {**form, "expected": 3})
    assert done.status_code == 302
    events = AuditEvent.objects.filter(action="job.run_now")
    assert sorted(int(e.object_id) for e in events) == sorted(j.pk for j in world["jobs"] if j.portfolio_id == acme)


def test_bulk_cancel_by_search_cancels_only_what_the_search_matched(world, op):
    seen = op.get("/console/jobs/all-matching/", {"operation": "cancel", "q": "Quay Court"}).context["seen"]
    form = {"operation": "cancel", "q": "Quay Court", "confirm": "yes", "reason": REASON, "expected": 1, "seen": seen}
    op.post("/console/jobs/all-matching/", form)
    letter = DeadLetter.objects.get()
    assert Property.objects.get(pk=letter.property_id).name == "Quay Court"


def test_job_actions_need_the_permission_of_their_kind(world, operator_user):
    auditor = make_user("aud", "auditor")
    with pytest.raises(PermissionDenied):
        jobs_act(action=JobAction.RUN_NOW, actor=auditor, reason=REASON, job_filter=JobFilter())
    client = Client()
    client.force_login(auditor)
    job = world["jobs"][0]
    assert client.post(f"/console/jobs/{job.pk}/action/", {"operation": "cancel", "reason": REASON}).status_code == 403
    assert client.get("/console/jobs/all-matching/?operation=cancel").status_code == 403
    assert not DeadLetter.objects.exists()


def test_a_customer_auditor_sees_no_job_action_and_cannot_reach_another_customers_job(world):
    customer = make_user("aud-acme")
    Membership.objects.create(user=customer, portfolio=world["acme"], role="auditor")
    client = Client()
    client.force_login(customer)
    mine = next(j for j in world["jobs"] if j.portfolio_id == world["acme"].pk)
    theirs = next(j for j in world["jobs"] if j.portfolio_id == world["birch"].pk)
    page = client.get(f"/console/jobs/{mine.pk}/")
    assert page.status_code == 200 and b"job-actions" not in page.content
    assert client.get(f"/console/jobs/{theirs.pk}/").status_code == 404


# --- Redrive: links to the new jobs, and a warning when nothing will run them -------------


def test_a_bulk_redrive_links_to_its_new_jobs_and_warns_when_no_worker_will_run_them(world, op):
    for job in world["jobs"][:2]:
        job_run_slice(job_id=job.pk, before_batch=lambda job_id: (_ for _ in ()).throw(DownstreamError(400)))
    assert DeadLetter.objects.count() == 2
    seen = op.get("/console/dead-letters/all-matching/?operation=redrive").context["seen"]
    form = {"operation": "redrive", "confirm": "yes", "reason": REASON, "expected": 2, "seen": seen}
    body = op.post("/console/dead-letters/all-matching/", form, follow=True).content.decode()
    new = sorted(CleanupJob.objects.filter(redrive_of__isnull=False).values_list("id", flat=True))
    assert f"/console/jobs/?id_min={new[0]}&amp;id_max={new[1]}&amp;redrives=yes" in body
    assert "No worker will run 2 of these jobs" in body
    listed = op.get(f"/console/jobs/?id_min={new[0]}&id_max={new[1]}&redrives=yes")
    assert [j.pk for j in listed.context["result"].rows] == new[::-1]


# --- The ticked letters and the typed reason survive a refusal ------------------------------


def test_a_short_reason_keeps_the_ticked_letters_and_the_typed_reason(world, op):
    for job in world["jobs"][:2]:
        job_run_slice(job_id=job.pk, before_batch=lambda job_id: (_ for _ in ()).throw(DownstreamError(400)))
    ids = sorted(DeadLetter.objects.values_list("id", flat=True))
    response = op.post("/console/dead-letters/action/", {"operation": "dismiss", "letter": ids, "reason": "nope"})
    assert response.status_code == 400
    body = response.content.decode()
    for letter_id in ids:
        assert f'name="letter" value="{letter_id}" checked' in body
    assert 'name="reason" value="nope"' in body and '<option value="dismiss" selected>' in body
    assert DeadLetter.objects.filter(status="open").count() == 2


# --- Search -----------------------------------------------------------------------------


def test_search_finds_jobs_letters_and_events_by_name_slot_id_and_category(world, op):
    job_run_slice(job_id=world["jobs"][0].pk, before_batch=lambda job_id: (_ for _ in ()).throw(DownstreamError(400)))
    letter = DeadLetter.objects.get()
    op.post(
        "/console/dead-letters/action/",
        {"operation": "dismiss", "letter": [letter.pk], "reason": REASON, "confirm": "yes"},
    )
    by_property = op.get("/console/search/?q=harbour").context["results"]
    assert [j.pk for j in by_property.jobs] == [world["jobs"][0].pk]
    assert [item.pk for item in by_property.letters] == [letter.pk]
    by_slot = op.get("/console/search/?q=2026-08-21T02:00").context["results"]
    assert len(by_slot.jobs) == 4 and by_slot.letters == [letter]
    by_category = op.get("/console/search/?q=downstream rejected").context["results"]
    assert [j.pk for j in by_category.jobs] == [world["jobs"][0].pk]
    assert [e.action for e in by_category.events] == ["dead_letter.dismissed"]
    by_id = op.get(f"/console/search/?q={world['jobs'][3].pk}").context["results"]
    assert world["jobs"][3] in by_id.jobs
    assert op.get("/console/jobs/?q=birch").context["result"].count == 1
    assert op.get("/console/dead-letters/?status=&q=acme").context["page"].count == 1
    assert op.get("/console/audit/?q=dismissed").context["page"].paginator.count == 1
    assert op.get("/console/search/?q=" + "x" * 101).status_code == 400


def test_search_shows_a_customer_only_their_own_portfolios(world):
    customer = make_user("aud-birch")
    Membership.objects.create(user=customer, portfolio=world["birch"], role="auditor")
    client = Client()
    client.force_login(customer)
    results = client.get("/console/search/?q=2026-08-21").context["results"]
    assert {j.portfolio_id for j in results.jobs} == {world["birch"].pk}


# --- The audit log --------------------------------------------------------------------


def test_the_audit_log_filters_by_actor_name_and_a_part_of_the_action(world, op, operator_user):
    pipeline_pause(actor=operator_user, reason="month-end freeze for Acme", portfolio_id=world["acme"].pk)
    pipeline_pause(actor=None, reason="birch asked us to wait", portfolio_id=world["birch"].pk)
    by_name = op.get(f"/console/audit/?actor={operator_user.username.upper()}").context["page"]
    assert [e.reason for e in by_name] == ["month-end freeze for Acme"]
    by_id = op.get(f"/console/audit/?actor={operator_user.pk}").context["page"]
    assert [e.reason for e in by_id] == ["month-end freeze for Acme"]
    assert op.get("/console/audit/?action=paused").context["page"].paginator.count == 2
    assert op.get("/console/audit/?actor=nobody-at-all").context["page"].paginator.count == 0


def test_audit_details_read_in_words_with_names_and_no_empty_keys(world, op, reviewer):
    from retention.services import legal_hold_place

    legal_hold_place(portfolio=world["acme"], placed_by=reviewer, reason="litigation on Acme leases")
    body = op.get("/console/audit/?action=legal_hold").content.decode()
    assert "property_id=None" not in body and "portfolio_id=" not in body
    assert "Acme Lettings" in body


# --- Names instead of ids -------------------------------------------------------------------


def test_pages_name_properties_and_sweeps_and_letters_count_the_failed_attempt(world, op):
    job_run_slice(job_id=world["jobs"][0].pk, before_batch=lambda job_id: (_ for _ in ()).throw(DownstreamError(400)))
    letter = DeadLetter.objects.get()
    assert letter.attempts == 0 and letter.failed_attempts == 1
    inbox = op.get("/console/dead-letters/").content.decode()
    assert "Harbour House" in inbox and "cleanup:2026-08-21T02:00Z" in inbox
    assert ">Downstream rejected (4xx)</option>" in inbox  # the filter shows labels too
    page = op.get(f"/console/dead-letters/{letter.pk}/").content.decode()
    assert "Harbour House" in page and "<dt>Failed attempts</dt><dd>1" in page
    assert "Harbour House" in op.get(f"/console/jobs/{letter.job_id}/").content.decode()
    assert "Harbour House" in op.get("/console/jobs/").content.decode()


def test_a_purge_job_shows_its_attachments_not_a_cursor(world, op):
    delete_job = world["jobs"][0]
    request = PurgeRequest.objects.create(
        key="a" * 64,
        delete_job=delete_job,
        portfolio_id=delete_job.portfolio_id,
        property_id=delete_job.property_id,
        record_kind="lease",
        document_ids=["doc-1", "doc-2", "doc-3", "doc-4"],
        documents_purged=2,
        documents_held=1,
        documents_referenced=1,
        created_at=NOW,
    )
    purge = CleanupJob.objects.create(
        sweep=delete_job.sweep,
        key=f"{delete_job.key}:purge",
        job_kind=JobKind.PURGE,
        purge_request=request,
        portfolio_id=delete_job.portfolio_id,
        property_id=delete_job.property_id,
        record_kind="lease",
        policy_version=delete_job.policy_version,
        cutoff=delete_job.cutoff,
        available_at=NOW,
        state="done",
        outcome="purge_held",
    )
    body = op.get(f"/console/jobs/{purge.pk}/").content.decode()
    assert "4 documents to purge: 2 purged, 0 already gone, 1 set aside under a legal hold, 1 still referenced" in body
    assert "Cursor" not in body and "No batch applied" not in body
    listing = op.get("/console/jobs/?job_kind=purge").content.decode()
    assert "2 purged, 1 set aside, 1 referenced" in listing


# --- Landing pages ----------------------------------------------------------------------------


def test_a_customers_manager_lands_on_a_page_that_says_where_their_roles_lead(world):
    manager = make_user("manager-acme")
    Membership.objects.create(user=manager, portfolio=world["acme"], role="property_manager")
    client = Client()
    client.force_login(manager)
    landing = client.get("/", follow=True)
    assert landing.status_code == 200
    body = landing.content.decode()
    assert 'data-testid="landing"' in body and "Acme Lettings" in body and "property manager" in body
    assert "/admin/retention/retentionpolicy/" in body
    forbidden = client.get("/console/workers/")
    assert forbidden.status_code == 403
    assert b'data-testid="forbidden"' in forbidden.content and b"/admin/retention/retentionpolicy/" in forbidden.content


def test_the_policy_versions_list_offers_review_only_to_those_who_may_review(world, manager):
    from retention.models import RetentionPolicy
    from retention.services import policy_version_submit

    policy = RetentionPolicy.objects.get(portfolio=world["acme"], record_kind="lease")
    policy_version_submit(policy=policy, retention_days=400, enabled=True, author=manager, reason="longer leases")
    Membership.objects.create(user=manager, portfolio=world["acme"], role="property_manager")
    client = Client()
    client.force_login(manager)
    body = client.get("/admin/retention/policyversion/").content.decode()
    assert "Review…" not in body and "awaiting a compliance reviewer" in body
    second = make_user("reviewer-two", "compliance_reviewer")
    client.force_login(second)
    assert "Review…" in client.get("/admin/retention/policyversion/").content.decode()


# --- Constant queries on list pages ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/console/", "/console/jobs/", "/console/dead-letters/", "/console/search/?q=a"])
def test_list_pages_issue_the_same_number_of_queries_whatever_the_number_of_rows(world, op, path):
    a_live_cluster()
    pipeline_pause(actor=None, reason="birch asked us to wait", portfolio_id=world["birch"].pk)
    for job in world["jobs"][:1]:
        job_run_slice(job_id=job.pk, before_batch=lambda job_id: (_ for _ in ()).throw(DownstreamError(400)))
    op.get(path)
    with CaptureQueriesContext(connection) as few:
        assert op.get(path).status_code == 200
    # More of every kind of row: pending and dead jobs, letters, in both portfolios.
    model = world["jobs"][1]
    for n in range(8):
        home = world["acme"] if n % 2 else world["birch"]
        prop = Property.objects.create(portfolio=home, name=f"Extra {n}")
        job = CleanupJob.objects.create(
            sweep=model.sweep,
            key=f"{model.sweep.key}:{home.pk}:{prop.pk}:lease",
            portfolio_id=home.pk,
            property_id=prop.pk,
            record_kind="lease",
            policy_version=model.policy_version,
            cutoff=model.cutoff,
            available_at=NOW,
            state="dead" if n < 4 else "pending",
        )
        if n < 4:
            DeadLetter.objects.create(
                job=job, category="downstream_rejected", attempts=0, first_seen_at=NOW, last_seen_at=NOW,
                portfolio_id=home.pk, property_id=prop.pk, record_kind="lease",
                policy_version_id=model.policy_version_id, sweep=model.sweep,
            )  # fmt: skip
    with CaptureQueriesContext(connection) as many:
        assert op.get(path).status_code == 200
    assert len(many) == len(few), [q["sql"][:80] for q in many.captured_queries]
