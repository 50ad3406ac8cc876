"""The console's pages for operators: sweeps and the drain forecast, jobs and
a job, a dead letter and "all matching", workers, pauses, portfolios, the
humanized figures, live fragments and the offline API docs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, PipelinePause, Sweep, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store accepts these again"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def world(portfolio, active_policy, time_machine):  # type: ignore[no-untyped-def]
    """Two portfolios; three partitions in Acme (two dead-lettered), one in Birch (done)."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for j in range(3):
        make_records(Property.objects.create(portfolio=portfolio, name=f"A{j}"), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="B0"), "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    for n, job in enumerate(jobs):
        job_run_slice(job_id=job.pk, before_batch=reject if n < 2 else None)
    return {"acme": portfolio, "birch": birch, "sweep": Sweep.objects.get(), "jobs": jobs}


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def test_every_new_page_renders_for_an_operator(world, op):
    letter = DeadLetter.objects.order_by("id").first()
    pages = [
        "/console/",
        "/console/?hours=168",
        "/console/sweeps/",
        f"/console/sweeps/{world['sweep'].pk}/",
        "/console/jobs/",
        f"/console/jobs/?sweep={world['sweep'].pk}&state=dead&portfolio={world['acme'].pk}&kind=lease&category=downstream_rejected",
        f"/console/jobs/{world['jobs'][0].pk}/",
        "/console/dead-letters/",
        f"/console/dead-letters/{letter.pk}/",
        "/console/dead-letters/all-matching/?operation=redrive",
        "/console/workers/",
        "/console/pauses/",
        f"/console/portfolios/{world['acme'].pk}/",
        "/console/audit/",
    ]
    for path in pages:
        response = op.get(path)
        assert response.status_code == 200, path
        shows_names = not path.startswith(("/console/workers", "/console/audit", "/console/sweeps/"))
        assert b"Acme Lettings" in response.content or not shows_names, path
