"""Dead letters that say why (issue 30, item 16): the store's HTTP status and
message class (never a body), the documents affected and what to do; the
inbox grouped by cause (category, status, record kind) with counts and one
decision per group through the bulk decision (reason, audit events)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, JobOutcome
from cleanup_ops.recovery.classification import DownstreamError, FailureCategory, message_class_of
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, Portfolio, Property
from retention.models import AuditEvent, Membership

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "store credentials rotated, trying again"


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def test_the_message_class_is_the_declared_media_type_and_nothing_else() -> None:
    assert message_class_of("Application/Problem+JSON; charset=utf-8") == "application/problem+json"
    assert message_class_of(None) == ""
    assert message_class_of("text/html\r\nX-Evil: 1") == ""
    assert message_class_of("not a media type") == ""


def test_a_purge_refused_with_403_shows_its_status_message_class_documents_and_what_to_do_but_never_the_body(
    portfolio, prop, active_policy, docstore, op, time_machine
) -> None:
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 3, ended=OLD)
    for record_id in ids:
        Lease.objects.filter(pk=record_id).update(document_id=f"doc-{record_id}")
    sweep_trigger(slot=SLOT, now=NOW)
    docstore.create(*[f"doc-{i}" for i in ids])
    assert job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE).pk).outcome == JobOutcome.DELETED
    docstore.set_faults(status=403, content_type="application/problem+json; charset=utf-8")
    purge = CleanupJob.objects.get(job_kind=JobKind.PURGE)
    job_run_slice(job_id=purge.pk)

    letter = DeadLetter.objects.get()
    assert (letter.category, letter.http_status, letter.message_class) == (
        FailureCategory.DOWNSTREAM_REJECTED,
        403,
        "application/problem+json",
    )
    page = op.get(reverse("console:dead_letter", args=[letter.pk])).content.decode()
    assert "403 Forbidden" in page
    assert "application/problem+json" in page
    assert "3 documents in its purge request: 3 waiting for this decision" in page
    assert all(f"doc-{i}" in page for i in ids)
    assert "refused this service&#x27;s credentials" in page
    # The body the store sent is nowhere: not in the row, not on the page, not in the API.
    row = DeadLetter.objects.filter(pk=letter.pk).values().get()
    assert "canary" not in repr(row)
    assert "canary" not in page
    api = op.get(f"/api/v1/dead-letters/{letter.pk}/").json()
    assert (api["http_status"], api["message_class"]) == (403, "application/problem+json")


def causes_world(portfolio, active_policy) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Acme: 3 lease jobs rejected with 400, 2 maintenance jobs with 400, 1
    lease job with 409; Birch (another customer): 2 lease jobs with 400."""
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    for owner in (portfolio, birch):
        active_policy(owner, "lease", 365)
        active_policy(owner, "maintenance_record", 365)
    plan: list[tuple[Portfolio, str, int]] = [
        *[(portfolio, "lease", 400)] * 3,
        *[(portfolio, "maintenance_record", 400)] * 2,
        (portfolio, "lease", 409),
        *[(birch, "lease", 400)] * 2,
    ]
    statuses: dict[int, int] = {}
    for n, (owner, kind, status) in enumerate(plan):
        prop = Property.objects.create(portfolio=owner, name=f"Block {n}")
        make_records(prop, kind, 1, ended=OLD)
        statuses[prop.pk] = status
    sweep_trigger(slot=SLOT, now=NOW)
    for job in CleanupJob.objects.order_by("id"):
        status = statuses[job.property_id]

        def refuse(job_id: int, status: int = status) -> None:
            raise DownstreamError(status, content_type="application/json")

        job_run_slice(job_id=job.pk, before_batch=refuse)
    assert DeadLetter.objects.count() == len(plan)
    return {"birch": birch}


def test_the_inbox_grouped_by_cause_counts_each_cause_with_one_query_and_says_what_to_do(
    portfolio, active_policy, op, time_machine
) -> None:
    time_machine.move_to(NOW, tick=False)
    causes_world(portfolio, active_policy)
    url = reverse("console:dead_letter_groups")
    op.get(url)  # warm the session and permission caches
    with CaptureQueriesContext(connection) as queries:
        response = op.get(url)
    page = response.content.decode()
    assert response.status_code == 200
    # Session, user, permissions, scope, the groups, the portfolio choices: a
    # fixed number whatever the letters (no query per group or per letter).
    assert len(queries) == 7, "\n".join(q["sql"][:120] for q in queries)
    assert "8 open letters in 3 groups." in page
    groups = response.context["groups"]
    assert [(g["category"], g["http_status"], g["record_kind"], g["n"]) for g in groups] == [
        ("downstream_rejected", 400, "lease", 5),
        ("downstream_rejected", 400, "maintenance_record", 2),
        ("downstream_rejected", 409, "lease", 1),
    ]
    assert "409 Conflict" in page and "reported a conflict or a lock" in page
    assert "rejected the request as invalid" in page


def test_one_decision_for_a_group_redrives_exactly_that_cause_with_a_reason_and_an_audit_event_per_letter(
    portfolio, active_policy, op, time_machine
) -> None:
    time_machine.move_to(NOW, tick=False)
    causes_world(portfolio, active_policy)
    groups = op.get(reverse("console:dead_letter_groups")).context["groups"]
    target = next(g for g in groups if (g["http_status"], g["record_kind"]) == (400, "maintenance_record"))
    page = op.get(reverse("console:dead_letters_bulk"), {"operation": "redrive", **target["params"]})
    assert page.status_code == 200 and page.context["count"] == 2
    assert "HTTP status 400" in page.content.decode()
    # The confirmation carries the digest of the letters it showed (item 13).
    post = {"operation": "redrive", **target["params"], "expected": "2", "seen": page.context["seen"], "confirm": "yes"}
    refused = op.post(reverse("console:dead_letters_bulk"), {**post, "reason": "short"})
    assert refused.status_code == 400 and DeadLetter.objects.open().count() == 8
    done = op.post(reverse("console:dead_letters_bulk"), {**post, "reason": REASON})
    assert done.status_code == 302
    redriven = DeadLetter.objects.filter(status=DeadLetter.Status.REDRIVEN)
    assert {(letter.record_kind, letter.http_status) for letter in redriven} == {("maintenance_record", 400)}
    assert redriven.count() == 2
    events = AuditEvent.objects.filter(action="dead_letter.redriven", object_type="dead_letter")
    assert sorted(events.values_list("object_id", flat=True)) == sorted(str(letter.pk) for letter in redriven)
    assert set(events.values_list("reason", flat=True)) == {REASON}


def test_a_customer_sees_only_their_own_letters_in_the_groups(portfolio, active_policy, time_machine) -> None:
    time_machine.move_to(NOW, tick=False)
    world = causes_world(portfolio, active_policy)
    auditor = make_user("birch-auditor")
    Membership.objects.create(user=auditor, portfolio=world["birch"], role="auditor")
    client = Client()
    client.force_login(auditor)
    response = client.get(reverse("console:dead_letter_groups"))
    assert response.status_code == 200
    assert [(g["http_status"], g["record_kind"], g["n"]) for g in response.context["groups"]] == [(400, "lease", 2)]


def test_a_bad_http_status_filter_is_a_400_naming_it(op) -> None:
    response = op.get(reverse("console:dead_letter_groups"), {"http_status": "42"})
    assert response.status_code == 400
    assert "http_status" in response.content.decode()
