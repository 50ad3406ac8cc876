from __future__ import annotations

import json
import logging

import pytest

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob
from cleanup_ops.recovery.classification import InvalidInput
from cleanup_ops.schedule import sweep_trigger
from config.logging import JsonLinesFormatter

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db


def test_worker_logs_are_json_lines_with_ids_and_no_record_contents(portfolio, prop, active_policy, caplog):
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 2, ended=utc("2020-01-01T00:00:00Z"))
    sweep_trigger()
    job = CleanupJob.objects.get()

    def fail(job_id: int) -> None:
        raise InvalidInput("tenant Jane Doe at 12 Elm St")

    with caplog.at_level(logging.INFO, logger="cleanup_ops"):
        job_run_slice(job_id=job.pk, before_batch=fail)
    lines = [JsonLinesFormatter().format(record) for record in caplog.records if record.name.startswith("cleanup_ops")]
    assert lines
    entries = [json.loads(line) for line in lines]
    failure = next(e for e in entries if e.get("category") == "policy_or_input")
    assert failure["job_id"] == job.pk and failure["level"] == "WARNING"
    assert all("Jane" not in line and "Elm" not in line for line in lines)


def test_only_whitelisted_extra_fields_reach_the_log():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "done", None, None)
    record.job_id = 7
    record.tenant_name = "Jane Doe"
    entry = json.loads(JsonLinesFormatter().format(record))
    assert entry["job_id"] == 7 and "tenant_name" not in entry and "Jane" not in json.dumps(entry)
