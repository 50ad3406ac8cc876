"""One slice engine: the token protocol (reserve, sleep with the lease kept,
defer, give back) exists once, and every kind of work runs through it.

Two halves. Statically, every call in the product to a step of the token
protocol is enumerated from the source (an AST walk over ``retention`` and
``cleanup_ops``) and must come from the engine or the step's own definition —
a second loop (a purge's own token wait, a single job's) fails here. Then each
path (a single delete job, a group of delete jobs, a purge) is run with the
engine's loop counted, so a path that went round it would fail too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cleanup_ops.execution import runner
from cleanup_ops.execution.runner import group_run_slice, job_run_slice
from cleanup_ops.models import JobState

from . import downstream_world

clock = downstream_world.clock
leases_with_files = downstream_world.leases_with_files
purge_job = downstream_world.purge_job

ROOT = Path(__file__).resolve().parent.parent

# The token protocol's steps, and the only functions (module, qualified name)
# that may call each. The engine reserves, sleeps, defers and gives back;
# group_tokens is the one reservation over ratelimit.tokens_reserve
# (tokens_acquire: a take-now wrapper the tests use).
PROTOCOL = {
    "group_tokens": {("cleanup_ops.execution.runner", "_SliceEngine.run")},
    "token_sleep": {("cleanup_ops.execution.runner", "_SliceEngine.run")},
    "group_tokens_unused": {("cleanup_ops.execution.runner", "_SliceEngine.run")},
    "jobs_give_back_for_tokens": {("cleanup_ops.execution.runner", "_SliceEngine._defer_without_tokens")},
    "tokens_reserve": {
        ("cleanup_ops.execution.leases", "group_tokens"),
        ("cleanup_ops.ratelimit", "tokens_acquire"),
    },
}


def _calls(package: str) -> set[tuple[str, str, str]]:
    """(callee, module, qualified caller) for every call of a protocol step."""
    found: set[tuple[str, str, str]] = set()
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)

        def walk(node: ast.AST, scope: list[str], module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    walk(child, [*scope, child.name])
                    continue
                if isinstance(child, ast.Call):
                    func = child.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name in PROTOCOL:
                        found.add((name, module, ".".join(scope)))
                walk(child, scope)

        walk(ast.parse(path.read_text()), [])
    return found


@pytest.mark.unit
def test_every_step_of_the_token_protocol_is_called_from_the_one_engine_only():
    calls = _calls("cleanup_ops") | _calls("retention")
    strays = sorted(
        (callee, module, caller) for callee, module, caller in calls if (module, caller) not in PROTOCOL[callee]
    )
    assert strays == []
    # And the engine does call each step (the enumeration is not vacuous).
    assert {callee for callee, _, _ in calls} == set(PROTOCOL)


@pytest.fixture
def engine_runs(monkeypatch):  # type: ignore[no-untyped-def]
    """Each run of the engine's loop: the unit's kind and how many jobs it had."""
    runs: list[tuple[str, int]] = []
    real = runner._SliceEngine.run

    def counted(self):  # type: ignore[no-untyped-def]
        runs.append((type(self.unit).__name__, len(self.jobs)))
        return real(self)

    monkeypatch.setattr(runner._SliceEngine, "run", counted)
    return runs


@pytest.mark.django_db
def test_a_single_delete_job_runs_as_the_engines_group_of_one(leases_with_files, engine_runs):
    job = downstream_world.delete_job()
    result = job_run_slice(job_id=job.pk, max_batches=50)
    assert result.outcome == "deleted" and result.rows_deleted > 0
    assert engine_runs == [("DeleteUnit", 1)]


@pytest.mark.django_db
def test_a_group_of_delete_jobs_runs_through_the_same_engine(leases_with_files, engine_runs):
    result = group_run_slice(owner="w")
    assert result.leased >= 1 and result.rows_deleted > 0
    assert engine_runs == [("DeleteUnit", result.leased)]


@pytest.mark.django_db
def test_a_purge_runs_through_the_same_engine_as_a_unit_of_store_requests(purge_job, engine_runs):
    result = job_run_slice(job_id=purge_job.pk)
    purge_job.refresh_from_db()
    assert purge_job.state == JobState.DONE and result.documents_purged > 0
    assert result.rows_deleted == 0  # a purge's figures are documents
    assert engine_runs == [("PurgeUnit", 1)]
