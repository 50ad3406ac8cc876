"""Classifying the statements the pipeline sends to PostgreSQL, and counting them server-side.

Two sources, printed side by side:

* **in-process** (``cleanup_drain`` in a child process): ``bench.instrument``'s
  ``StatementCounter``, a Django execute wrapper, puts each statement in the class of
  the innermost pipeline function running when it was sent, and by its text
  (``classify_text``, here) where none is running.
* **server-side** (every run, including the ``qcluster`` ones): ``pg_stat_statements``,
  loaded with ``shared_preload_libraries`` on the throwaway cluster (``ALTER SYSTEM``
  and a restart, so ``harness/`` stays as it is). Its calls per normalised statement
  are classified by text (``classify_text``) and include ``BEGIN``/``COMMIT`` and the
  django-q2 broker's own queries. The benchmark's own polling runs under a separate
  role (``bench_watch``) and is left out. Without ``pg_stat_statements`` (a
  ``DATABASE_URL`` server that does not load it) the fallback is
  ``pg_stat_database.xact_commit`` and ``tup_*`` deltas, which PostgreSQL flushes
  lazily (up to 10 s late for an idle backend) and which include the polling.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# Display order of the classes.
CLASSES = (
    "lease/pick",
    "job load",
    "fence",
    "scope lock + policy",
    "fence + scope lock + policy",
    "ledger lookup",
    "policy + ledger lookup",
    "candidates",
    "DELETE",
    "candidates + DELETE",
    "document dispositions",
    "ledger insert",
    "job update",
    "ledger insert + job update",
    "job release",
    "sweep status",
    "dispatcher",
    "admission",
    "rate tokens",
    "failure/redrive",
    "broker (django-q)",
    "django-q status cache",
    "health check (SELECT 1)",
    "other",
    "transaction control",
    "FK check (trigger)",
)
# Not statements the client sent: PostgreSQL's foreign-key triggers run one lookup per
# inserted row, and pg_stat_statements lists them; they are shown, never counted.
SERVER_INTERNAL = ("FK check (trigger)",)
DATA_CLASSES = (
    "ledger lookup",
    "policy + ledger lookup",
    "candidates",
    "DELETE",
    "candidates + DELETE",
    "ledger insert",
    "ledger insert + job update",
)

# Text rules, first match wins, on the statement with double quotes removed and
# whitespace collapsed, lower case. Written against the product's statements, each
# in the module that runs it (cleanup_ops/execution/statements.py, leases.py,
# outbox.py, sweeps.py, admission.py, ratelimit.py, downstream/), and the ORM
# queries of leases.py, dispatch.py, admission.py and models/jobs.py.
_TEXT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("transaction control", r"^(begin|commit|rollback|savepoint|release savepoint|start transaction)\b"),
        ("FK check (trigger)", r"^select (\$\d+|1) from only public\.\w+ x where .* for (key )?share of x"),
        ("health check (SELECT 1)", r"^select (\$\d+|1)$"),
        ("django-q status cache", r"django_q_cache"),
        ("broker (django-q)", r"django_q_"),
        ("fence", r"^select (id, )?cursor from cleanup_ops_cleanupjob"),
        ("fence + scope lock + policy", r"f as materialized \(select id, cursor"),
        ("scope lock + policy", r"for share of p, po"),
        ("ledger lookup", r"^select operation_id, last_id from cleanup_ops_ledgerentry"),
        ("policy + ledger lookup", r"union all select null, null, null, null, null, operation_id, last_id"),
        (
            "document dispositions",
            r"insert into cleanup_ops_documentdisposition .* on conflict \(document_id\) do update",
        ),
        (
            "candidates + DELETE",
            r"^with c as \(select r\.id( as id)?(, r\.\w+ as ts)? from .* d as \(delete from properties_",
        ),
        ("ledger insert + job update", r"written as \(insert into cleanup_ops_ledgerentry"),
        (
            "candidates",
            r"left join lateral \(select r\.id( as id)?(, r\.\w+ as ts)? from"
            r"|^select count\(\*\), max\(c\.id\)(, \w+\(c\.\w+\))* from \(select r\.id",
        ),
        ("DELETE", r"^(with g\(.*\) )?delete from properties_|^with g\(.*\), d as \(delete from properties_"),
        ("ledger insert", r"^insert into cleanup_ops_ledgerentry"),
        ("job update", r"set cursor = g\.new_cursor|^update cleanup_ops_cleanupjob set cursor ="),
        ("lease/pick", r"pg_advisory_xact_lock|count\(distinct cleanup_ops_cleanupjob\.lease_token\)"),
        (
            "lease/pick",
            r"for update skip locked.*order by .*available_at|order by .*available_at.*for update skip locked",
        ),
        ("lease/pick", r"^update cleanup_ops_cleanupjob set state = \$\d+, lease_token = \$\d+"),
        ("job release", r"^update cleanup_ops_cleanupjob set state = \$\d+, lease_token = null.*available_at"),
        (
            "job load",
            r"^select cleanup_ops_cleanupjob\.id( as id)?, cleanup_ops_cleanupjob\.portfolio_id"
            r".*cleanup_ops_sweep\.slot",
        ),
        ("dispatcher", r"row_number\(\) over|set enqueued_at = |count\(cleanup_ops_cleanupjob\.id\) as n from"),
        ("dispatcher", r"for update skip locked"),
        ("sweep status", r"^update cleanup_ops_sweep set status|cleanup_ops_cleanupjob\.sweep_id = \$\d+ and"),
        ("admission", r"^insert into cleanup_ops_cleanupjob|^insert into cleanup_ops_sweep|from properties_property p"),
        ("admission", r"from retention_policyversion|^update cleanup_ops_sweep set|from cleanup_ops_sweep"),
        ("rate tokens", r"cleanup_ops_ratebucket"),
        ("failure/redrive", r"cleanup_ops_deadletter|retention_auditevent"),
        ("lease/pick", r"cleanup_ops_pipelinepause"),
    )
)


def statement_text(statement: Any, connection: Any = None) -> str:
    """A statement as text: the product's are ``psycopg.sql.Composable`` until
    they execute, so the instrumentation renders one with the connection it
    runs on (``connection``, a psycopg connection; else the default's)."""
    if isinstance(statement, str):
        return statement
    if connection is None:
        from django.db import connection as default

        default.ensure_connection()
        connection = default.connection
    return str(statement.as_string(connection))


def normalise(statement: Any) -> str:
    return " ".join(statement_text(statement).replace('"', "").split()).lower()


def classify_text(statement: Any) -> str:
    text = normalise(statement)
    for name, pattern in _TEXT_RULES:
        if pattern.search(text):
            return name
    return "other"


def short(statement: Any, width: int = 110) -> str:
    text = " ".join(statement_text(statement).replace('"', "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- server-side

WATCH_ROLE = "bench_watch"


def _with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@dataclass
class ServerCounts:
    """What the server saw between ``start`` and ``stop`` of one measurement."""

    method: str
    seconds: float
    # query text -> [calls, exec ms, rows, plan ms, shared buffer pages touched (hit + read)]
    statements: dict[str, list[Any]] = field(default_factory=dict)
    xact: dict[str, int] = field(default_factory=dict)  # pg_stat_database deltas

    def by_class(self) -> dict[str, list[float]]:
        """class -> [calls, execution ms, planning ms, buffer pages touched].

        Pages touched (shared buffers hit or read) count the work the server
        did, as calls count statements: unlike its milliseconds, they do not
        change with the load of the rest of the machine."""
        out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])
        for text, (calls, ms, _rows, plan_ms, *pages) in self.statements.items():
            entry = out[classify_text(text)]
            entry[0] += calls
            entry[1] += ms
            entry[2] += plan_ms
            entry[3] += int(pages[0]) if pages else 0
        return dict(out)

    def total(self, *, exclude: tuple[str, ...] = SERVER_INTERNAL) -> int:
        return int(sum(v[0] for k, v in self.by_class().items() if k not in exclude))

    def as_json(self) -> dict[str, Any]:
        top = sorted(self.statements.items(), key=lambda kv: -kv[1][0])[:40]
        return {
            "method": self.method,
            "seconds": round(self.seconds, 3),
            "by_class": {k: [int(v[0]), round(v[1], 2), round(v[2], 2), int(v[3])] for k, v in self.by_class().items()},
            "top": [[classify_text(t), short(t), int(v[0]), round(v[1], 2), round(v[3], 2)] for t, v in top],
            "xact": self.xact,
        }


class PgStats:
    """``pg_stat_statements`` (or ``pg_stat_database``) for the benchmark's database."""

    def __init__(self, url: str) -> None:
        from harness.postgres import admin_url

        self.url = url
        self.admin, self.db = admin_url(url)
        self.method = "pg_stat_database"
        self.watch_url = url
        self.watch_separate = False
        # Further roles whose statements are not the run's (bench/app_impact.py's pgbench).
        self.excluded_roles: list[str] = []

    def enable(self, cluster: Any | None, log: Callable[[str], None]) -> None:
        """Load pg_stat_statements (our throwaway cluster: ALTER SYSTEM and a restart)."""
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            loaded = "pg_stat_statements" in conn.execute("SHOW shared_preload_libraries").fetchone()[0]
            if not loaded and cluster is not None:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        if not loaded and cluster is not None:
            cluster.restart()  # before Django has connected: nothing to close
            # Its own settings exist only once it is loaded; max needs one more restart.
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET pg_stat_statements.max = 20000")
                conn.execute("ALTER SYSTEM SET pg_stat_statements.track_utility = on")
                conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
            cluster.restart()
            loaded = True
        with psycopg.connect(self.admin, autocommit=True) as conn:
            if loaded:
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    conn.execute("SELECT count(*) FROM pg_stat_statements").fetchone()
                    self.method = "pg_stat_statements"
                except psycopg.Error as exc:
                    log(f"pg_stat_statements not usable ({type(exc).__name__}); counting with pg_stat_database")
            try:
                if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [WATCH_ROLE]).fetchone():
                    conn.execute(f"CREATE ROLE {WATCH_ROLE} LOGIN SUPERUSER")
                self.watch_url = _with_user(self.url, WATCH_ROLE)
                self.watch_separate = True
            except psycopg.Error:
                log("no separate role for the benchmark's polling: its queries are counted too")

    def watcher(self) -> Any:
        """An autocommit connection to the benchmark database for polling (its own role)."""
        import psycopg

        return psycopg.connect(self.watch_url, autocommit=True)

    def _xact(self) -> dict[str, int]:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, tup_deleted"
                " FROM pg_stat_database WHERE datname = %s",
                [self.db],
            ).fetchone()
        names = (
            "xact_commit",
            "xact_rollback",
            "tup_returned",
            "tup_fetched",
            "tup_inserted",
            "tup_updated",
            "tup_deleted",
        )
        return dict(zip(names, map(int, row or [0] * 7), strict=True))

    def start(self) -> dict[str, Any]:
        import psycopg

        if self.method == "pg_stat_statements":
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
        return {"t": time.monotonic(), "xact": self._xact()}

    def stop(self, mark: dict[str, Any]) -> ServerCounts:
        import psycopg

        seconds = time.monotonic() - mark["t"]
        result = ServerCounts(self.method, seconds)
        if self.method == "pg_stat_statements":
            with psycopg.connect(self.admin, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT s.query, sum(s.calls), sum(s.total_exec_time), sum(s.rows), sum(s.total_plan_time),"
                    " sum(s.shared_blks_hit + s.shared_blks_read)"
                    " FROM pg_stat_statements s"
                    " JOIN pg_database d ON d.oid = s.dbid"
                    " WHERE d.datname = %s"
                    " AND s.userid NOT IN (SELECT oid FROM pg_roles WHERE rolname = ANY(%s))"
                    " GROUP BY s.query",
                    [self.db, [WATCH_ROLE if self.watch_separate else "", *self.excluded_roles]],
                ).fetchall()
            result.statements = {
                q: [int(c), float(ms), int(r), float(pl or 0), int(pages or 0)] for q, c, ms, r, pl, pages in rows
            }
        after = self._xact()
        result.xact = {k: after[k] - mark["xact"].get(k, 0) for k in after}
        return result


def sent(by_class: dict[str, list[float]]) -> tuple[int, int, int]:
    """(statements the client sent without BEGIN/COMMIT, BEGIN/COMMIT and other
    transaction control, server-internal FK lookups) from a ``by_class`` mapping."""
    tx = int(by_class.get("transaction control", [0, 0])[0])
    internal = int(sum(by_class.get(c, [0, 0])[0] for c in SERVER_INTERNAL))
    total = int(sum(v[0] for v in by_class.values()))
    return total - tx - internal, tx, internal
