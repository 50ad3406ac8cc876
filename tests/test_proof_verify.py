"""The proof export carries every operation id's inputs, and
``manage.py cleanup_proof_verify FILE`` (or ``python
cleanup_ops/proof_verify.py FILE``, standard library only) recomputes every
operation id and digest from the file alone (issue 30, item 17)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from cleanup_ops.execution.batches import operation_id
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep
from cleanup_ops.proof_verify import operation_id as verifier_operation_id
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
SLOT = utc("2026-08-21T02:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def exported(portfolio, prop, active_policy, operator_user, tmp_path, time_machine):  # type: ignore[no-untyped-def]
    """A sweep of two partitions deleted in batches of 2, exported as JSON and CSV over HTTP."""
    time_machine.move_to(utc("2026-08-21T02:05:00Z"), tick=False)
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    make_records(prop, "lease", 5, ended=OLD)
    make_records(Property.objects.create(portfolio=portfolio, name="Quay Court"), "maintenance_record", 3, ended=OLD)
    sweep_trigger(slot=SLOT)
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, batch_size=2)
    assert LedgerEntry.objects.count() == 3 + 2
    sweep = Sweep.objects.get()
    client = Client()
    client.force_login(operator_user)
    files = {}
    for fmt in ("json", "csv"):
        response = client.get(f"/console/sweeps/{sweep.pk}/proof.{fmt}")
        assert response.status_code == 200
        files[fmt] = tmp_path / f"proof.{fmt}"
        files[fmt].write_bytes(response.content)
    return files


def test_the_export_states_each_operation_ids_inputs_and_they_recompute_to_the_ledgers_ids(exported) -> None:
    proof = json.loads(exported["json"].read_text())
    assert proof["slot"] == "2026-08-21T02:00:00Z"
    stated = {op["operation_id"] for p in proof["partitions"] for op in p["operation_inputs"]}
    assert stated == set(LedgerEntry.objects.values_list("operation_id", flat=True))
    for partition in proof["partitions"]:
        for op in partition["operation_inputs"]:
            entry = LedgerEntry.objects.get(operation_id=op["operation_id"])
            assert (op["after_id"], op["limit"]) == (entry.after_id, entry.batch_limit)
            args = {
                "record_kind": partition["record_kind"],
                "property_id": partition["property_id"],
                "after_id": op["after_id"],
                "limit": op["limit"],
            }
            # The verifier's own formula agrees with the one the batch path uses.
            assert verifier_operation_id(slot=proof["slot"], cutoff=op["cutoff"], **args) == op["operation_id"]
            assert operation_id(slot=SLOT, cutoff=entry.cutoff, **args) == op["operation_id"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_the_verifier_recomputes_every_digest_of_an_untouched_export(exported, fmt: str, capsys) -> None:
    call_command("cleanup_proof_verify", str(exported[fmt]))
    out = capsys.readouterr().out
    assert "verified: 2 job digest(s), 5 operation id(s) recomputed" in out


def test_the_verifier_runs_without_django_or_a_database(exported) -> None:
    # Only the standard library: run from outside the project, with no settings.
    done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-I", str(ROOT / "cleanup_ops" / "proof_verify.py"), str(exported["csv"])],
        capture_output=True,
        text=True,
        cwd="/",
        env={},
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("5 operation id(s) recomputed")


def test_a_changed_input_a_dropped_operation_or_a_changed_digest_fails_naming_the_job(exported, capsys) -> None:
    proof = json.loads(exported["json"].read_text())
    first, second = proof["partitions"]
    first["operation_inputs"][1]["after_id"] += 1  # claims another slice than the one deleted
    second["operation_inputs"].pop()  # hides an operation
    path = exported["json"].with_name("tampered.json")
    path.write_text(json.dumps(proof))
    with pytest.raises(CommandError) as raised:
        call_command("cleanup_proof_verify", str(path))
    assert raised.value.returncode == 1
    out = capsys.readouterr().out
    assert f"job {first['job_id']}: the operation after id {first['operation_inputs'][1]['after_id']}" in out
    assert f"job {second['job_id']}: 2 operation(s) stated, 1 with inputs" in out
    assert "sweep: digest recomputes to" in out

    text = exported["csv"].read_text().replace(proof["digest"], "0" * 64)
    path = exported["csv"].with_name("tampered.csv")
    path.write_text(text)
    with pytest.raises(CommandError):
        call_command("cleanup_proof_verify", str(path))
    assert "sweep: digest recomputes to" in capsys.readouterr().out


def test_a_file_that_is_not_a_proof_is_refused_with_a_clear_message(tmp_path, capsys) -> None:
    path = tmp_path / "nonsense.json"
    path.write_text("{not json")
    with pytest.raises(CommandError):
        call_command("cleanup_proof_verify", str(path))
    assert "not a readable proof export" in capsys.readouterr().out
