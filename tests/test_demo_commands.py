"""The Quick start's ``make demo``: its own commands, in child processes, on a
fresh database of the test server (``make demo`` itself runs them on the demo's
kept cluster in ``var/pg``), read afterwards. The rest of the suite calls the
services; this is the newcomer's first command, as a newcomer runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from harness.postgres import drop_database, recreate_database

ROOT = Path(__file__).resolve().parent.parent
DEMO = ["--portfolios", "2", "--properties-per-portfolio", "2", "--records-per-property", "40", "--seed", "42"]

pytestmark = pytest.mark.system


@pytest.fixture
def fresh_database() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    url = urlunsplit(parts._replace(path="/demo_commands"))
    recreate_database(url)
    yield url
    drop_database(url, "demo_commands")


def manage(*args: str, database: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "true",
        "DATABASE_URL": database,
        # As ``make demo`` exports it: its sweep drops the empty monthly table
        # partitions from 2015 back to back (no application shares the database).
        "CLEANUP_TABLE_PARTITION_PAUSE_SECONDS": "0",
    }
    result = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_demos_sweep_and_drain_delete_records_on_a_fresh_database_and_leave_no_job_open(fresh_database):
    manage("migrate", "--noinput", "-v", "0", database=fresh_database)
    manage("createcachetable", database=fresh_database)
    manage("seed_demo", *DEMO, database=fresh_database)
    dry_run = manage("cleanup_sweep", "--dry-run", database=fresh_database)
    manage("cleanup_sweep", database=fresh_database)
    manage("cleanup_drain", "--max-seconds", "60", database=fresh_database)

    eligible = int(dry_run.split("Total: ", 1)[1].split(" eligible", 1)[0])
    with psycopg.connect(fresh_database) as db:
        (deleted,) = db.execute("SELECT coalesce(sum(rows_deleted), 0) FROM cleanup_ops_ledgerentry").fetchone()
        (dropped,) = db.execute("SELECT coalesce(sum(rows), 0) FROM cleanup_ops_tablepartitiondrop").fetchone()
        states = dict(db.execute("SELECT state, count(*) FROM cleanup_ops_cleanupjob GROUP BY state").fetchall())
    assert deleted > 0
    # Every eligible record the dry run counted went, by row deletes or whole table partitions.
    assert deleted + dropped == eligible
    assert states and set(states) == {"done"}, states
