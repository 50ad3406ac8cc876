"""The pipeline's guarantees on a host keyed by UUIDs (issue 41): the model-based test and
the interleavings that lock the scope rows, run by a second pytest process on the third
test schema (``tests/schema_uuid``: its user, customers and sites keyed by UUIDs).

A pytest process has one set of models, and the suite's is the demo's (integer keys), so
the cases run in a process of their own with ``tests.settings_uuid`` (``UUID_SCHEMA``),
on a test database of its own on the suite's PostgreSQL server. What it runs
(``uuid_schema_tests``):

- ``tests/test_guarantees_model.py``: the state machine of the promises, its size the
  Hypothesis profile's (the one this process runs: ``HYPOTHESIS_PROFILE``, tests/testenv.py);
- the one-actor interleavings whose worker holds its scope rows ``FOR SHARE`` (a batch's
  fence and scope statement, a purge's scope lock) while a hold is placed on every scope,
  a hold commits after its session ended, or the application moves a record to another
  site or customer (``test_interleavings.scope_lock_cases``);
- the compound cases of a scope row pinned by the application while a purge or a batch
  waits on it, a second record goes, a hold commits or a version is approved.

``make test-uuid`` runs this file; docs/developing.md, "The UUID schema", runs any test
on that schema directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit
from xml.etree import ElementTree

import pytest

from .interleaving import scope_key
from .schema_uuid.pytest_plugin import HEADER, uuid_keyed_models

ROOT = Path(__file__).resolve().parent.parent
# The arguments that run pytest on the UUID schema.
UUID_SCHEMA = ("--ds=tests.settings_uuid", "-p", "tests.schema_uuid.pytest_plugin")
# The state machine only: the file's hand-driven case is laid out for the demo's key order.
GUARANTEES_MODEL_TEST = "tests/test_guarantees_model.py::test_the_guarantees_hold_under_any_interleaving"
COMPOUND_SCOPE_LOCK_TESTS = (
    "tests/test_interleavings_compound.py::"
    "test_a_purge_waiting_on_another_scope_keeps_a_file_whose_other_record_goes_and_is_held_meanwhile",
    "tests/test_interleavings_compound.py::test_a_version_approved_while_the_batch_waits_on_a_pinned_scope_row_is_obeyed",
)


def uuid_schema_tests() -> list[str]:
    """The node ids the second process runs (the module docstring says why these)."""
    from .test_interleavings import scope_lock_cases

    return [GUARANTEES_MODEL_TEST, *scope_lock_cases(), *COMPOUND_SCOPE_LOCK_TESTS]


def expected_count() -> int:
    """How many tests ``uuid_schema_tests`` names: the compound tests are parametrized."""
    from . import test_interleavings_compound as compound
    from .test_interleavings import scope_lock_cases

    purge_waits = len(compound.checkpoints.PURGE) * len(compound.HOLD_SCOPES)
    pinned_batches = len(compound.LEASE_STARTS) * len(compound.POLICY_CHANGES)
    return 1 + len(scope_lock_cases()) + purge_waits + pinned_batches


def second_database_url(url: str, worker: str) -> str:
    """``url`` naming a database of the UUID run's own (pytest-django makes ``test_<name>``
    from it), apart from this process's and from any other worker's."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "app"
    return parts._replace(path=f"/{name}_uuid_schema{'_' + worker if worker else ''}").geturl()


@pytest.mark.system
@pytest.mark.starts_first  # about 2.5 min alone, 6.5 min in a loaded CI run
def test_the_guarantees_and_the_scope_lock_interleavings_hold_on_uuid_keyed_users_customers_and_sites(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    env["DATABASE_URL"] = second_database_url(os.environ["DATABASE_URL"], worker)
    report = tmp_path / "uuid-schema.xml"
    result = subprocess.run(  # noqa: S603 - this interpreter, pytest, fixed arguments
        [
            sys.executable,
            "-m",
            "pytest",
            *UUID_SCHEMA,
            "-p",
            "no:xdist",
            f"--junitxml={report}",
            *uuid_schema_tests(),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    output = f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, output
    # The header the UUID schema's plugin wrote: the run had its models (it refuses any other).
    header = f"{HEADER} user schema_uuid.User, customer schema_uuid.Customer, site schema_uuid.Site"
    assert header in result.stdout, output
    suite = ElementTree.parse(report).getroot().find("testsuite")  # noqa: S314 - our own pytest's report
    assert suite is not None, output
    counts = {name: int(suite.get(name, "0")) for name in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": expected_count(), "failures": 0, "errors": 0, "skipped": 0}, output


def test_the_uuid_run_refuses_to_start_on_the_demos_integer_keyed_models() -> None:
    with pytest.raises(pytest.UsageError) as refused:
        uuid_keyed_models()
    assert str(refused.value) == (
        "not keyed by a UUID: user auth.User, customer properties.Portfolio, site properties.Property"
        " (run with --ds=tests.settings_uuid)"
    )


def test_the_uuid_run_has_a_test_database_of_its_own_per_worker() -> None:
    url = "postgres://postgres@127.0.0.1:5432/app"
    assert second_database_url(url, "") == "postgres://postgres@127.0.0.1:5432/app_uuid_schema"
    assert second_database_url(url, "gw1") == "postgres://postgres@127.0.0.1:5432/app_uuid_schema_gw1"


def test_a_scope_key_is_spelled_alike_by_the_history_log_the_orm_and_the_objects() -> None:
    key = uuid.uuid4()
    assert scope_key(key) == scope_key(str(key)) == str(key)
    # An integer key: a JSON number, a JSON object's key (text), the ORM's int.
    assert scope_key(7) == scope_key("7") == 7
    assert scope_key(None) is None
