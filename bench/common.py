"""What every part of the pipeline benchmark shares: the repository root, logging, the
code version being measured, Django set-up and raw SQL helpers."""

# ruff: noqa: S607 - runs git to name the measured commit

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """The commit the measured code is at, and whether the tree differs from it outside the
    benchmark's own code (bench/ and harness/)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":!bench", ":!harness"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"{head}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        marker = ROOT / "bench" / ".commit"
        return marker.read_text().strip() if marker.exists() else "unknown"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- Django


def django_setup(batch_size: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_hex(24))
    os.environ["CLEANUP_BATCH_SIZE"] = str(batch_size)
    import django

    django.setup()


def text(fragment: Any) -> str:
    """A fragment the product composed (a ``psycopg.sql.Composable``, e.g. the
    eligibility predicate) as this database's text, quoted as the connection
    quotes: the bench's own baselines write their statements as text around
    it. The product never does this (tests/test_sql_style.py)."""
    from django.db import connection

    connection.ensure_connection()
    return str(fragment.as_string(connection.connection))


def sql(statement: Any, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def try_sql(statement: str) -> None:
    """Statements that need superuser rights (fine to skip on a managed database)."""
    from django.db import DatabaseError

    try:
        sql(statement)
    except DatabaseError:
        pass
