"""A throwaway PostgreSQL cluster in a fresh /tmp directory, and database helpers.

The one launcher behind ``scripts/pg-cluster.sh`` (and so ``scripts/test.sh``),
``bench/pipeline.py``, ``bench/console.py`` and ``chaos/run.py``:

* server binaries from ``PATH`` (``initdb``) or the newest ``/usr/lib/postgresql/*/bin``;
* PostgreSQL refuses to run as root, so as root the cluster runs as the ``postgres``
  user (created if missing) through ``runuser -u postgres --``, in a ``/tmp``
  directory chowned to it (a clone under /root is not readable by that user);
* started for speed, not durability: ``fsync``, ``synchronous_commit`` and
  ``full_page_writes`` off, loopback only, socket in /tmp, 200 connections;
* ``stop()`` stops the server and removes the directory, and is safe to call
  on every exit path (twice, or after a failed start).

From a shell (what ``scripts/pg-cluster.sh`` runs)::

    eval "$(python -m harness.postgres start --print-env)"   # DATABASE_URL, PGDATA_DIR, PG_BIN, PG_PORT
    python -m harness.postgres restart "$PGDATA_DIR"
    python -m harness.postgres stop "$PGDATA_DIR"

Starting and stopping need only the standard library; the database helpers
(``create_database``, ``copy_database``, ``drop_database``) import psycopg.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from harness.ports import free_port
from harness.procs import pids, renice, stat_fields

RUN_AS = "postgres"
# Durability off: a throwaway cluster is recreated, never recovered.
SERVER_OPTIONS = (
    "-k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    " -c max_connections=200"
)
STATE_FILE = "harness.json"  # lets `restart DIR` / `stop DIR` from a shell find the binaries and the user


class ClusterError(RuntimeError):
    """The cluster could not be created or started (the server's own log was printed to stderr)."""


def find_bin() -> Path | None:
    """The directory with ``initdb`` and ``pg_ctl``: from PATH, else the newest /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return candidates[-1].parent if candidates else None


def _ensure_run_as_user() -> int:
    """The uid of the ``postgres`` user, created as a system user when missing."""
    try:
        return pwd.getpwnam(RUN_AS).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", RUN_AS], check=True)
        return pwd.getpwnam(RUN_AS).pw_uid


class Cluster:
    """One throwaway cluster. ``start()`` returns its URL; use ``with`` or call ``stop()`` in ``finally``."""

    def __init__(
        self, bin_dir: str | Path | None = None, *, prefix: str = "retention-pg.", database: str = "app"
    ) -> None:
        found = Path(bin_dir) if bin_dir else find_bin()
        if found is None:
            raise ClusterError("no PostgreSQL server binaries (initdb) in PATH or /usr/lib/postgresql/*/bin")
        self.bin = found
        self.prefix = prefix
        self.database = database
        self.dir: Path | None = None
        self.port = 0
        self.as_user: list[str] = []

    # ------------------------------------------------------------------ state

    @property
    def data(self) -> Path:
        if self.dir is None:
            raise ClusterError("the cluster is not started")
        return self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def running(self) -> bool:
        return self.dir is not None

    @property
    def postmaster_pid(self) -> int | None:
        """The server's main process (not our child once pg_ctl has returned)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (ClusterError, OSError, ValueError, IndexError):
            return None

    def _save_state(self) -> None:
        state = {"bin": str(self.bin), "port": self.port, "as_user": self.as_user, "database": self.database}
        (self.dir / STATE_FILE).write_text(json.dumps(state))  # type: ignore[operator]

    @classmethod
    def attach(cls, directory: str | Path) -> Cluster:
        """The cluster a previous ``start`` (maybe another process) created in ``directory``."""
        directory = Path(directory)
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            # No state file (a start that failed very early): stop with what we can find.
            state = {"bin": os.environ.get("PG_BIN") or find_bin() or "", "port": 0, "as_user": None}
        cluster = cls(state["bin"] or None, database=state.get("database", "app"))
        cluster.dir = directory
        cluster.port = int(state.get("port") or 0)
        if state.get("as_user") is None:
            state["as_user"] = ["runuser", "-u", RUN_AS, "--"] if os.geteuid() == 0 else []
        cluster.as_user = list(state["as_user"])
        return cluster

    # ------------------------------------------------------------------ lifecycle

    def _run(self, *args: str, log: Path | None = None) -> None:
        """A server binary as the cluster's user, in the cluster's directory (that user may
        not be allowed into our working directory)."""
        cmd = [*self.as_user, str(self.bin / args[0]), *args[1:]]
        try:
            subprocess.run(cmd, cwd=self.dir, check=True, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as exc:
            if log is not None and log.exists():
                sys.stderr.write(log.read_text(errors="replace"))
            raise ClusterError(f"{args[0]} {args[-1]} failed (exit {exc.returncode})") from exc

    def _ctl(self, *args: str) -> None:
        log = self.data / "log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-w", *args, log=log)

    def start(self) -> str:
        """initdb and start; returns the URL of database ``self.database`` (not created: see
        ``create_database``). On failure the directory is removed again."""
        if self.dir is not None:
            return self.url
        self.dir = Path(tempfile.mkdtemp(prefix=self.prefix, dir="/tmp"))
        try:
            if os.geteuid() == 0:
                os.chown(self.dir, _ensure_run_as_user(), -1)
                self.as_user = ["runuser", "-u", RUN_AS, "--"]
            self.port = free_port()
            self._save_state()
            initdb_log = self.dir / "initdb.log"
            with initdb_log.open("w") as out:
                initdb = [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
                result = subprocess.run(
                    [*self.as_user, *initdb],
                    cwd=self.dir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            if result.returncode != 0:
                sys.stderr.write(initdb_log.read_text(errors="replace"))
                raise ClusterError(f"initdb failed (exit {result.returncode})")
            self._ctl("-o", f"-p {self.port} {SERVER_OPTIONS}", "start")
        except BaseException:
            self.stop()
            raise
        return self.url

    def restart(self) -> None:
        """A fast restart (clients are disconnected); settings stay as started."""
        self._ctl("-m", "fast", "restart")

    def stop(self) -> None:
        """Stop the server (fast) and remove the directory. Idempotent; never raises."""
        if self.dir is None:
            return
        directory, data = self.dir, self.dir / "data"
        if (data / "PG_VERSION").exists():
            subprocess.run(
                [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                cwd=directory,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        shutil.rmtree(directory, ignore_errors=True)
        self.dir = None

    def renice(self, nice: int) -> None:
        """Give the postmaster and its processes (and so every backend it forks later) ``nice``."""
        postmaster = self.postmaster_pid
        if postmaster is None:
            return
        for pid in pids():
            fields = stat_fields(pid)
            if fields and postmaster in (pid, int(fields[1])):
                renice(pid, nice)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------- databases


def admin_url(url: str) -> tuple[str, str]:
    """(URL of the maintenance database ``postgres`` on the same server, the URL's database name)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def create_database(url: str) -> None:
    """Create the URL's database unless it already accepts connections."""
    import psycopg

    try:
        psycopg.connect(url).close()
        return
    except psycopg.OperationalError:
        pass
    admin, name = admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def copy_database(url: str, source: str, target: str) -> None:
    """``target`` := a file-level copy of ``source`` (same pages, indexes, statistics, visibility map).

    Connections to ``target`` are terminated; close your own first (Django: ``connections.close_all()``)."""
    import psycopg

    admin, _ = admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
        try:
            conn.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}" STRATEGY = FILE_COPY')
        except psycopg.errors.SyntaxError:  # PostgreSQL < 15
            conn.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')


def drop_database(url: str, name: str) -> None:
    import psycopg

    admin, _ = admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---------------------------------------------------------------------- command line


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.postgres", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="create and start a cluster; prints its URL and directory")
    start.add_argument("--bin", help="directory with initdb and pg_ctl (default: PATH, /usr/lib/postgresql/*/bin)")
    start.add_argument("--prefix", default="retention-pg.", help="name prefix of the /tmp directory")
    start.add_argument(
        "--print-env",
        action="store_true",
        help="print shell assignments (DATABASE_URL, PGDATA_DIR, PG_BIN, PG_PORT, PG_AS) for eval",
    )
    for name in ("restart", "stop"):
        sub.add_parser(name, help=f"{name} the cluster in DIR").add_argument("dir", metavar="DIR")
    args = parser.parse_args(argv)
    # A TERM/HUP while initdb runs must still remove the half-made directory.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    try:
        if args.command == "start":
            cluster = Cluster(args.bin, prefix=args.prefix)
            url = cluster.start()
            if args.print_env:
                values = {"DATABASE_URL": url, "PGDATA_DIR": str(cluster.dir), "PG_BIN": str(cluster.bin)}
                values["PG_PORT"] = str(cluster.port)
                for key, value in values.items():
                    print(f"{key}={shlex.quote(value)}")
                print(f"PG_AS=({' '.join(shlex.quote(word) for word in cluster.as_user)})")
            else:
                print(url)
                print(cluster.dir)
        elif args.command == "restart":
            Cluster.attach(args.dir).restart()
        else:
            try:
                cluster = Cluster.attach(args.dir)
            except ClusterError:  # no binaries to stop a server with, so none can be running
                shutil.rmtree(args.dir, ignore_errors=True)
                return 0
            cluster.stop()
    except ClusterError as exc:
        print(f"harness.postgres: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
