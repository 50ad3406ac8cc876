from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent
from retention.services import legal_hold_place

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "store is healthy again, retrying"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


def grow(active_policy, reviewer, *, portfolios: int, properties: int) -> None:  # type: ignore[no-untyped-def]
    """More portfolios, properties, jobs, ledger rows, dead letters and audit events."""
    for i in range(portfolios):
        portfolio = Portfolio.objects.create(name=f"P{i}", slug=f"p-{portfolios}-{i}")
        active_policy(portfolio, "lease", 365)
        ids = []
        for j in range(properties):
            prop = Property.objects.create(portfolio=portfolio, name=f"B{j}")
            ids += make_records(prop, "lease", 3, ended=OLD)
        legal_hold_place(
            portfolio=portfolio, record_kind="lease", record_id=ids[0], placed_by=reviewer, reason="x for the tests"
        )


def run_everything(sweep_slot: str) -> None:
    from cleanup_ops.schedule import slot_parse

    sweep_trigger(slot=slot_parse(sweep_slot))
    for n, job in enumerate(CleanupJob.objects.filter(state="pending").order_by("id")):
        job_run_slice(job_id=job.pk, batch_size=2, before_batch=reject if n % 3 == 0 else None)


PAGES = [
    "/console/",
    "/console/?hours=168",
    "/console/sweeps/",
    "/console/sweeps/{sweep}/",
    "/console/jobs/",
    "/console/jobs/?state=dead",
    "/console/jobs/?sweep={sweep}&portfolio={portfolio}&kind=lease",
    "/console/jobs/{job}/",
    "/console/dead-letters/",
    "/console/dead-letters/{letter}/",
    "/console/dead-letters/all-matching/?operation=redrive",
    "/console/workers/",
    "/console/pauses/",
    "/console/portfolios/{portfolio}/",
    "/console/audit/",
]


def page_ids() -> dict[str, int]:
    """The newest sweep, dead letter (and its job and portfolio) to put in ``PAGES``."""
    letter = DeadLetter.objects.latest("id")
    return {"sweep": letter.sweep_id, "job": letter.job_id, "letter": letter.pk, "portfolio": letter.portfolio_id}


def count_queries(client: Client, path: str) -> int:
    from django.core.cache import cache

    cache.clear()  # measure the uncached page (retention debt is cached for a minute)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, path
    return len(ctx.captured_queries)


def test_every_console_page_issues_a_constant_number_of_queries(active_policy, reviewer, operator_user, time_machine):
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    client = Client()
    client.force_login(operator_user)
    grow(active_policy, reviewer, portfolios=1, properties=1)
    run_everything("2026-08-21T02:00Z")
    small = {p: count_queries(client, p.format(**page_ids())) for p in PAGES}
    grow(active_policy, reviewer, portfolios=4, properties=5)
    time_machine.move_to("2026-08-22T02:05:00Z", tick=False)
    client.force_login(operator_user)  # a day later: the idle session has ended (cleanup_ops.middleware)
    run_everything("2026-08-22T02:00Z")
    assert CleanupJob.objects.count() > 15 and DeadLetter.objects.count() > 5
    large = {p: count_queries(client, p.format(**page_ids())) for p in PAGES}
    assert all(n > 3 for n in small.values()), small  # the pages really were measured
    assert large == small


@pytest.fixture
def letters(portfolio, active_policy, time_machine):
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    active_policy(portfolio, "lease", 365)
    for j in range(2):
        make_records(Property.objects.create(portfolio=portfolio, name=f"B{j}"), "lease", 2, ended=OLD)
    sweep_trigger()
    for job in CleanupJob.objects.all():
        job_run_slice(job_id=job.pk, before_batch=reject)
    return list(DeadLetter.objects.order_by("id"))


def test_the_inbox_redrives_selected_letters_after_a_confirmation(letters, operator_user):
    client = Client()
    client.force_login(operator_user)
    ids = [str(letter.pk) for letter in letters]
    missing = client.post("/console/dead-letters/action/", {"operation": "redrive", "letter": ids, "reason": " "})
    assert missing.status_code == 400 and b"reason of at least 10 characters" in missing.content
    review = client.post("/console/dead-letters/action/", {"operation": "redrive", "letter": ids, "reason": REASON})
    assert review.status_code == 200 and b"Confirm redrive" in review.content
    assert CleanupJob.objects.count() == 2  # nothing happens before the confirmation
    done = client.post(
        "/console/dead-letters/action/",
        {"operation": "redrive", "letter": ids, "reason": REASON, "confirm": "yes"},
        follow=True,
    )
    new_ids = sorted(CleanupJob.objects.filter(redrive_of__isnull=False).values_list("id", flat=True))
    assert len(new_ids) == 2
    body = done.content.decode()
    assert "Redrove 2 dead letters: see" in body
    assert (
        f'href="/console/jobs/?id_min={new_ids[0]}&amp;id_max={new_ids[1]}&amp;redrives=yes">the 2 new jobs</a>' in body
    )
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 2


def test_the_inbox_filters_by_category_and_portfolio(letters, operator_user, portfolio):
    client = Client()
    client.force_login(operator_user)
    hit = client.get(f"/console/dead-letters/?category=downstream_rejected&portfolio={portfolio.pk}")
    miss = client.get("/console/dead-letters/?category=timeout")
    assert all(f'data-testid="letter-{letter.pk}"'.encode() in hit.content for letter in letters)
    assert b"No dead letters match" in miss.content


def test_the_proof_exports_as_csv_and_json(letters, operator_user):
    client = Client()
    client.force_login(operator_user)
    sweep = letters[0].sweep_id
    csv = client.get(f"/console/sweeps/{sweep}/proof.csv")
    assert csv["Content-Type"] == "text/csv" and csv.content.decode().startswith("job_id,job_key,")
    body = client.get(f"/console/sweeps/{sweep}/proof.json").json()
    assert body["jobs"] == 2 and len(body["digest"]) == 64


@pytest.mark.parametrize("fmt", ["xml", "csv%22%0d%0aSet-Cookie:x=1", "CSV", "json "])
def test_a_proof_export_in_another_format_is_a_400_before_any_header(letters, operator_user, fmt):
    client = Client()
    client.force_login(operator_user)
    response = client.get(f"/console/sweeps/{letters[0].sweep_id}/proof.{fmt}")
    assert response.status_code == 400 and b"csv or json" in response.content
    assert "Content-Disposition" not in response and "Set-Cookie" not in response


def test_pause_and_resume_from_the_console_need_a_reason_and_are_audited(operator_user):
    client = Client()
    client.force_login(operator_user)
    client.post("/console/pause/", {"operation": "pause", "reason": "short"})
    assert not AuditEvent.objects.filter(action="pipeline.paused").exists()
    client.post("/console/pause/", {"operation": "pause", "reason": "database upgrade tonight"})
    page = client.get("/console/")
    assert b"Pipeline PAUSED: database upgrade tonight" in page.content
    client.post("/console/pause/", {"operation": "resume", "reason": "upgrade went fine"})
    assert b"Pipeline running" in client.get("/console/").content
    assert AuditEvent.objects.filter(action__in=["pipeline.paused", "pipeline.resumed"]).count() == 2


def test_check_deploy_is_clean_with_production_settings():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "SESSION_", "CSRF_"))}
    env.update(
        {
            "DEBUG": "false",
            "SECRET_KEY": "x" * 30 + "Y7#kq!Zp2@vW9$LmR4^tB8&" + "z" * 20,
            "ALLOWED_HOSTS": "retention.example.com",
        }
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
