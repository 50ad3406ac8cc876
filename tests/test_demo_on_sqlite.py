"""The Quick start's ``make demo`` runs on the embedded SQLite default, which the
rest of the suite (on PostgreSQL) never reaches: a statement SQLite refuses (an
``ORDER BY`` inside a ``UNION`` arm, say) passes every other test and breaks the
newcomer's first command. So the demo's own commands run here, in a child
process on a fresh SQLite file, and the file is read afterwards."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ["--portfolios", "2", "--properties-per-portfolio", "2", "--records-per-property", "40", "--seed", "42"]


def manage(*args: str, database: Path) -> str:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "true",
        "DATABASE_URL": f"sqlite:///{database}",
    }
    result = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_demos_sweep_and_drain_delete_records_on_the_sqlite_default_and_leave_no_job_open(tmp_path):
    database = tmp_path / "demo.sqlite3"
    manage("migrate", "--noinput", "-v", "0", database=database)
    manage("createcachetable", database=database)
    manage("seed_demo", *DEMO, database=database)
    manage("cleanup_sweep", database=database)
    manage("cleanup_drain", "--max-seconds", "60", database=database)

    with sqlite3.connect(database) as db:
        (deleted,) = db.execute("SELECT coalesce(sum(rows_deleted), 0) FROM cleanup_ops_ledgerentry").fetchone()
        states = dict(db.execute("SELECT state, count(*) FROM cleanup_ops_cleanupjob GROUP BY state").fetchall())
    assert deleted > 0
    assert states and set(states) == {"done"}, states
