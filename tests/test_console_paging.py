"""Jobs and dead-letter lists (issue 30, item 19): two-way pagination with the
page's position, column sort, and select-all acting on exactly the ticked
jobs (with a reason and a confirmation)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store is fixed, run these now"


@pytest.fixture
def seven_jobs(portfolio, active_policy, time_machine, monkeypatch):  # type: ignore[no-untyped-def]
    """Seven pending lease jobs (attempts 0..6 in reverse id order); pages of 3."""
    time_machine.move_to(NOW, tick=False)
    monkeypatch.setattr("cleanup_ops.views.jobs.PAGE_SIZE", 3)
    monkeypatch.setattr("cleanup_ops.views.dead_letters.PAGE_SIZE", 3)
    active_policy(portfolio, "lease", 365)
    for n in range(7):
        make_records(Property.objects.create(portfolio=portfolio, name=f"Block {n}"), "lease", 1, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    for n, job in enumerate(jobs):
        CleanupJob.objects.filter(pk=job.pk).update(attempt=6 - n, available_at=NOW + timedelta(hours=1))
    return [job.pk for job in jobs]


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def shown(response) -> list[int]:  # type: ignore[no-untyped-def]
    return [job.pk for job in response.context["result"].rows]


def position(response) -> str:  # type: ignore[no-untyped-def]
    match = re.search(r'data-testid="position">([^<]+)<', response.content.decode())
    assert match, "no position on the page"
    return match.group(1)


def follow(client: Client, response, testid: str):  # type: ignore[no-untyped-def]
    match = re.search(rf'<a href="(\?[^"]*)"[^>]*data-testid="{testid}"', response.content.decode())
    assert match, f"no {testid} link"
    return client.get(reverse("console:jobs") + match.group(1).replace("&amp;", "&"))


def test_the_jobs_list_pages_forward_and_back_with_its_position_and_a_fixed_number_of_queries(seven_jobs, op):
    newest = sorted(seven_jobs, reverse=True)
    first = op.get(reverse("console:jobs"))
    assert shown(first) == newest[:3] and position(first) == "Jobs 1 to 3 of 7"
    assert 'data-testid="page-previous"' not in first.content.decode()
    second = follow(op, first, "page-next")
    assert shown(second) == newest[3:6] and position(second) == "Jobs 4 to 6 of 7"
    with CaptureQueriesContext(connection) as on_second:
        op.get(second.request["PATH_INFO"] + "?" + second.request["QUERY_STRING"])
    third = follow(op, second, "page-next")
    assert shown(third) == newest[6:] and position(third) == "Jobs 7 to 7 of 7"
    assert 'data-testid="page-next"' not in third.content.decode()
    back = follow(op, third, "page-previous")
    assert shown(back) == newest[3:6] and position(back) == "Jobs 4 to 6 of 7"
    with CaptureQueriesContext(connection) as on_back:
        follow(op, third, "page-previous")
    assert len(on_back) == len(on_second)  # as deep or deeper, the same queries
    last = follow(op, first, "page-last")
    assert shown(last) == newest[4:] and position(last) == "Jobs 5 to 7 of 7"
    assert shown(follow(op, last, "page-first")) == newest[:3]


def test_a_column_header_sorts_the_jobs_both_ways_and_paging_keeps_the_sort(seven_jobs, op):
    page = op.get(reverse("console:jobs"), {"sort": "attempts"})
    by_attempts = sorted(seven_jobs, key=lambda pk: 6 - seven_jobs.index(pk))  # attempt grows as ids fall
    assert shown(page) == by_attempts[:3]
    body = page.content.decode()
    assert 'aria-sort="ascending"' in body and "sort=-attempts" in body  # the header now sorts the other way
    assert shown(follow(op, page, "page-next")) == by_attempts[3:6]
    down = op.get(reverse("console:jobs"), {"sort": "-attempts"})
    assert shown(down) == list(reversed(by_attempts))[:3]


def test_an_unknown_sort_or_a_bad_page_boundary_is_a_400_naming_it(seven_jobs, op):
    for params, field in (({"sort": "password"}, "sort"), ({"after": "x"}, "after"), ({"before": "²"}, "before")):
        response = op.get(reverse("console:jobs"), params)
        assert response.status_code == 400 and field in response.content.decode()
    assert op.get(reverse("console:dead_letters"), {"sort": "-nope"}).status_code == 400


def test_a_vanished_boundary_row_shows_the_first_page_rather_than_nothing(seven_jobs, op):
    response = op.get(reverse("console:jobs"), {"after": "987654321"})
    assert response.status_code == 200 and len(shown(response)) == 3


def test_the_letters_inbox_sorts_and_pages_both_ways_too(seven_jobs, op):
    CleanupJob.objects.update(available_at=NOW)

    def refuse(job_id: int) -> None:
        raise DownstreamError(400)

    for pk in seven_jobs:
        job_run_slice(job_id=pk, before_batch=refuse)
    ids = sorted(DeadLetter.objects.values_list("id", flat=True))
    first = op.get(reverse("console:dead_letters"), {"sort": "id"})
    assert [letter.pk for letter in first.context["page"].rows] == ids[:3]
    assert "Letters 1 to 3 of 7" in first.content.decode()
    match = re.search(r'<a href="(\?[^"]*)"[^>]*data-testid="page-next"', first.content.decode())
    assert match
    second = op.get(reverse("console:dead_letters") + match.group(1).replace("&amp;", "&"))
    assert [letter.pk for letter in second.context["page"].rows] == ids[3:6]
    assert 'data-select-all="letter"' in second.content.decode()


def test_ticked_jobs_are_confirmed_then_run_now_with_one_audit_event_each_and_nothing_else_changes(
    seven_jobs, op, portfolio
):
    birch = Portfolio.objects.create(name="Birch", slug="birch")
    page = op.get(reverse("console:jobs"))
    assert 'data-select-all="job"' in page.content.decode()
    ticked = seven_jobs[:2]
    form = {"operation": "run_now", "job": [str(pk) for pk in ticked], "reason": REASON, "next": "/console/jobs/"}
    confirm = op.post(reverse("console:jobs_selected"), form)
    assert confirm.status_code == 200
    assert [job.pk for job in confirm.context["jobs"]] == ticked
    assert CleanupJob.objects.filter(available_at=NOW).count() == 0  # nothing yet
    short = op.post(reverse("console:jobs_selected"), {**form, "reason": "now", "confirm": "yes"})
    assert short.status_code == 400 and CleanupJob.objects.filter(available_at=NOW).count() == 0
    done = op.post(reverse("console:jobs_selected"), {**form, "confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == "/console/jobs/"
    assert sorted(CleanupJob.objects.filter(available_at=NOW).values_list("id", flat=True)) == ticked
    events = AuditEvent.objects.filter(action="job.run_now")
    assert sorted(int(i) for i in events.values_list("object_id", flat=True)) == ticked
    assert birch.pk  # another portfolio's presence changes nothing above


def test_ticking_nothing_or_an_id_that_is_no_pending_job_asks_again(seven_jobs, op):
    response = op.post(
        reverse("console:jobs_selected"), {"operation": "cancel", "job": ["987654321"], "reason": REASON}
    )
    assert response.status_code == 400 and "Tick at least one pending job." in response.content.decode()
    assert not DeadLetter.objects.exists()


def test_another_customers_row_as_a_page_boundary_answers_like_a_missing_one(
    portfolio, active_policy, time_machine, monkeypatch
):
    from retention.models import Membership

    from .conftest import make_user

    time_machine.move_to(NOW, tick=False)
    monkeypatch.setattr("cleanup_ops.views.jobs.PAGE_SIZE", 3)
    birch = Portfolio.objects.create(name="Birch", slug="birch")
    for owner in (portfolio, birch):
        active_policy(owner, "lease", 365)
    for n in range(7):
        make_records(Property.objects.create(portfolio=portfolio, name=f"Block {n}"), "lease", 1, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="Birch Row"), "lease", 1, ended=OLD)
    sweep_trigger()
    for n, job in enumerate(CleanupJob.objects.order_by("id")):
        CleanupJob.objects.filter(pk=job.pk).update(attempt=n)
    theirs = CleanupJob.objects.get(portfolio_id=birch.pk)
    CleanupJob.objects.filter(pk=theirs.pk).update(
        attempt=4, created_at=CleanupJob.objects.order_by("id")[3].created_at
    )
    auditor = make_user("acme-auditor")
    Membership.objects.create(user=auditor, portfolio=portfolio, role="auditor")
    client = Client()
    client.force_login(auditor)
    for sort in ("-id", "attempts", "-created"):
        for boundary in ("after", "before"):
            mine = client.get(reverse("console:jobs"), {"sort": sort, boundary: str(theirs.pk)})
            missing = client.get(reverse("console:jobs"), {"sort": sort, boundary: "987654321"})
            assert mine.status_code == missing.status_code == 200
            assert shown(mine) == shown(missing) and position(mine) == position(missing) == "Jobs 1 to 3 of 7"
