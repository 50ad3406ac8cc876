from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cleanup_ops.models import CleanupJob
from properties.models import Property

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

NOW = "2026-08-21T02:05:00Z"
OLD = utc("2020-01-01T00:00:00Z")


def run_json(command: str, *args: str) -> dict:
    out = StringIO()
    call_command(command, *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture
def swept(portfolio, active_policy, reviewer, time_machine, row_deletes_only):
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "tenant_activity", 30)
    props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(2)]
    make_records(props[0], "lease", 7, ended=OLD)
    make_records(props[1], "lease", 2, ended=OLD)
    make_records(props[1], "tenant_activity", 4, ended=OLD)
    from retention.services import legal_hold_place

    legal_hold_place(
        portfolio=portfolio, property=props[1], record_kind="lease", placed_by=reviewer, reason="x for the tests"
    )
    return run_json("cleanup_sweep", "--slot", "2026-08-21T02:00Z")


def test_drain_runs_every_due_job_and_summarises_outcomes_per_kind(swept):
    summary = run_json("cleanup_drain")
    assert summary["jobs_by_state"] == {"done": 3}
    assert summary["jobs_by_outcome"] == {"deleted": 2, "held": 1}
    assert summary["per_record_kind"] == {
        "lease": {"deleted": 7, "held": 2},
        "tenant_activity": {"deleted": 4, "held": 0},
    }
    assert summary["ledger_rows"] == 3  # the held batch is on the ledger too, with 0 rows deleted


def test_status_reports_jobs_by_state_due_age_and_rows_per_sweep(swept, time_machine):
    time_machine.move_to("2026-08-21T02:06:00Z", tick=False)
    before = run_json("cleanup_status")
    assert before["jobs_by_state"]["pending"] == 3
    assert before["oldest_due_age_seconds"] == 60.0
    call_command("cleanup_drain", stdout=StringIO())
    after = run_json("cleanup_status")
    assert after["jobs_by_state"]["done"] == 3 and after["oldest_due_age_seconds"] is None
    assert after["sweeps"][0]["rows_deleted"] == 11 and after["sweeps"][0]["status"] == "drained"
    assert after["rows_deleted_total"] == 11


def test_the_drain_readable_summary_names_deleted_and_kept_records(swept):
    out = StringIO()
    call_command("cleanup_drain", stdout=out)
    text = out.getvalue()
    assert "lease" in text and "7 deleted" in text and "2 kept (held)" in text
    assert "Jobs by outcome: deleted: 2, held: 1" in text


def test_drain_rejects_a_negative_wait(swept):
    with pytest.raises(CommandError, match="--max-seconds"):
        call_command("cleanup_drain", "--max-seconds", "-1", stdout=StringIO())
    assert CleanupJob.objects.filter(state="pending").count() == 3
