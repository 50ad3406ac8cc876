"""The world the downstream purge tests share: expired leases with files, the
deleting sweep admitted at a fixed instant, and the purge job it leaves.

The ``clock``, ``leases_with_files`` and ``purge_job`` fixtures live here;
each ``tests/test_downstream_*.py`` module takes them in by name (e.g.
``purge_job = downstream_world.purge_job``), because ``leases_with_files``
asks for ``clock`` and ``purge_job`` for ``leases_with_files``.
"""

from __future__ import annotations

import pytest

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, JobKind, JobOutcome
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease

from . import interference
from .conftest import make_records
from .interference import NOW, OLD, SLOT

clock = interference.clock  # the guarantees' clock: SLOT, then NOW


def attach(model, ids: list[int], prefix: str = "doc") -> list[str]:  # type: ignore[no-untyped-def]
    """Give rows ``ids`` of ``model`` the document ids ``<prefix>-<id>``."""
    for record_id in ids:
        model.objects.filter(pk=record_id).update(document_id=f"{prefix}-{record_id}")
    return [f"{prefix}-{record_id}" for record_id in ids]


def delete_job() -> CleanupJob:
    return CleanupJob.objects.get(job_kind=JobKind.DELETE)


def purge_jobs() -> list[CleanupJob]:
    return list(CleanupJob.objects.filter(job_kind=JobKind.PURGE).order_by("id"))


@pytest.fixture
def leases_with_files(portfolio, prop, active_policy, clock):  # type: ignore[no-untyped-def]
    """Six expired leases, four of them with a file; the sweep is admitted."""
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 6, ended=OLD)
    documents = attach(Lease, ids[:4])
    sweep_trigger(slot=SLOT, now=NOW)
    return ids, documents


@pytest.fixture
def purge_job(leases_with_files, docstore):  # type: ignore[no-untyped-def]
    """The records are deleted; one purge job for their four files waits."""
    _, documents = leases_with_files
    docstore.create(*documents)
    assert job_run_slice(job_id=delete_job().pk).outcome == JobOutcome.DELETED
    (job,) = purge_jobs()
    return job
