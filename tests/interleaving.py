"""Helpers of the interleaving suite (``tests/test_interleavings.py``).

Three pieces, each usable alone:

- ``CheckpointHold``: the test's side of ``cleanup_ops.checkpoints``. It takes
  the session advisory lock of a checkpoint on a raw psycopg connection of its
  own, so a worker that passes that checkpoint stops there; ``wait_for_worker``
  polls ``pg_locks`` (never a sleep) until the worker's side connection waits
  on the key and reads the worker's main backend pid from its
  ``application_name`` (``cleanup-checkpoint:<name>:<pid>``); ``release`` lets
  it go.
- ``InThread``: a function run on a thread with its own database connection
  (closed at the end, with the checkpoint side connection), whose backend pid,
  result or error the test reads; ``settle`` waits until it has finished or
  is seen waiting on a lock (``pg_blocking_pids``), whichever comes first.
- ``History``: what happened, as the database committed it. A deferred
  constraint trigger on every table the invariants are about (the three record
  kinds, holds, policy versions, pauses, jobs, the ledger, purge requests)
  logs each row change *at commit time* (``clock_timestamp()`` inside the
  deferred trigger, which runs as the transaction commits) with its
  transaction id and the actor that made it (``SET LOCAL interleaving.actor``).
  From that log the state of any record, hold, policy version, pause or job
  at any instant is replayed, so every invariant is checked against the
  order in which things actually became true, not against the end state:
  "was a hold active when this row's delete committed", "did the store
  delete this file while a record named it". The document store's request
  log gives the instant of each file deletion (same host clock).
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, connections

try:
    from cleanup_ops import checkpoints
except ImportError:  # the code before checkpoints existed (the regression tests run there too)
    checkpoints = None  # type: ignore[assignment]

WAIT_SECONDS = 15.0


def raw_connection(*, autocommit: bool = True) -> psycopg.Connection:
    """A psycopg connection to the test database, outside Django's connection handling."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=autocommit)


def poll(predicate: Callable[[], Any], *, timeout: float = WAIT_SECONDS, what: str) -> Any:
    """Call ``predicate`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


# --- Holding a worker at a checkpoint --------------------------------------------------


class CheckpointHold:
    """Hold the advisory lock of checkpoint ``name`` until ``release()``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = checkpoints.checkpoint_key(name)
        self.conn = raw_connection()
        self.conn.execute("SET application_name = 'interleaving-test'")
        self.conn.execute("SELECT pg_advisory_lock(%s, %s)", [checkpoints.CHECKPOINT_NAMESPACE, self.key])
        self.released = False

    def waiters(self) -> list[int]:
        rows = self.conn.execute(
            # pg_locks is the cluster's: another database's (an xdist worker's) waiters are not ours.
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s"
            " AND objsubid = 2 AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [checkpoints.CHECKPOINT_NAMESPACE, self.key],
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    def wait_for_worker(self, worker: InThread, *, timeout: float = WAIT_SECONDS) -> int:
        """The worker's main backend pid, once its side connection waits on this checkpoint.

        Fails at once when the worker finishes without reaching the checkpoint
        (a checkpoint the code does not pass), not after the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for side_pid in self.waiters():
                row = self.conn.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE pid = %s", [side_pid]
                ).fetchone()
                if row and row[0].startswith(f"cleanup-checkpoint:{self.name}:"):
                    return int(row[0].rsplit(":", 1)[1])
            if not worker.thread.is_alive():
                worker.reraise()
                raise AssertionError(f"the worker finished without reaching checkpoint {self.name}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no worker reached checkpoint {self.name} within {timeout}s")
            time.sleep(0.005)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", [checkpoints.CHECKPOINT_NAMESPACE, self.key])
            self.conn.close()


# --- Work on another connection --------------------------------------------------------


class InThread:
    """Run ``fn`` on a thread with its own database connection."""

    def __init__(self, fn: Callable[[], Any], *, name: str = "worker") -> None:
        self.fn = fn
        self.pid = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        assert self._started.wait(WAIT_SECONDS), "the thread never connected"

    def _run(self) -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                self.pid = int(cur.fetchone()[0])
            self._started.set()
            self.result = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self._started.set()
            try:
                connections.close_all()
            finally:
                if checkpoints is not None:
                    checkpoints.close_side_connection()

    def settle(
        self, observer: psycopg.Connection, *, timeout: float = WAIT_SECONDS, ready: Callable[[], bool] | None = None
    ) -> str:
        """``"done"`` once the thread finished, ``"waiting"`` once its session
        waits on a lock (any: a row, an advisory checkpoint), polled in
        ``pg_stat_activity``; ``"ready"`` once ``ready()`` says so."""

        def state() -> str:
            if not self.thread.is_alive():
                return "done"
            if ready is not None and ready():
                return "ready"
            row = observer.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [self.pid]).fetchone()
            if row and row[0]:
                return "waiting"
            # The thread may also wait on its checkpoint side connection.
            side = observer.execute(
                "SELECT count(*) FROM pg_stat_activity a WHERE a.application_name LIKE %s"
                " AND cardinality(pg_blocking_pids(a.pid)) > 0",
                [f"cleanup-checkpoint:%:{self.pid}"],
            ).fetchone()
            return "waiting" if side and side[0] else ""

        return poll(state, timeout=timeout, what=f"thread {self.thread.name} to finish or wait on a lock")

    def join(self, timeout: float = 60.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"thread {self.thread.name} did not finish within {timeout}s"

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def set_actor(name: str) -> None:
    """Inside the caller's transaction: name the actor its row changes are logged under."""
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('interleaving.actor', %s, true)", [name])


# --- The committed history -------------------------------------------------------------

HISTORY_TABLE = "interleaving_history"


def history_tables() -> dict[str, str]:
    """Logical name -> table of every model the invariants are about."""
    from cleanup_ops.models import CleanupJob, LedgerEntry, PipelinePause, PurgeRequest, TablePartitionDrop
    from retention.models import LegalHold, PolicyVersion, RetentionPolicy
    from retention.registry import REGISTRY, get_spec

    tables = {kind: get_spec(kind).model._meta.db_table for kind in REGISTRY}
    # A one-hop kind's path rows (a visit's unit): where its property is, at any instant.
    tables |= {path_name(kind): hop[0] for kind in REGISTRY if (hop := get_spec(kind).path_hop)}
    tables |= {
        "hold": LegalHold._meta.db_table,
        "version": PolicyVersion._meta.db_table,
        "policy": RetentionPolicy._meta.db_table,
        "pause": PipelinePause._meta.db_table,
        "job": CleanupJob._meta.db_table,
        "ledger": LedgerEntry._meta.db_table,
        "purge_request": PurgeRequest._meta.db_table,
        "partition_drop": TablePartitionDrop._meta.db_table,
    }
    return tables


def path_name(kind: str) -> str:
    """The history's name of a one-hop kind's path table."""
    return f"{kind}.path"


@dataclass(frozen=True)
class KindColumns:
    """How the history reads a record kind's rows: the columns of its key,
    customer, site (or the path row's column naming it), timestamp and file."""

    pk: str
    portfolio: str
    property: str | None  # the record's site column; None without one or through a path
    via: str | None  # a one-hop kind: the record's column naming its path row
    path_pk: str | None
    path_property: str | None
    timestamp: str
    timestamp_is_date: bool
    document: str | None
    integer_key: bool


def kind_columns(kind: str) -> KindColumns:
    from retention.registry import get_spec

    spec = get_spec(kind)
    hop = spec.path_hop
    return KindColumns(
        pk=spec.pk_column,
        portfolio=spec.portfolio_column,
        property=spec.property_column if spec.property_shape == "direct" else None,
        via=spec.property_column if hop else None,
        path_pk=hop[1] if hop else None,
        path_property=hop[2] if hop else None,
        timestamp=spec.timestamp_column,
        timestamp_is_date=spec.timestamp_is_date,
        document=spec.attachment_column,
        integer_key=spec.integer_key,
    )


def history_install() -> None:
    """Create the log and its deferred triggers (idempotent), and empty the log."""
    with connection.cursor() as cur:
        cur.execute(
            f"""CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (
                seq bigserial PRIMARY KEY, tbl text NOT NULL, op text NOT NULL, old jsonb, new jsonb,
                at timestamptz NOT NULL, xid bigint NOT NULL, actor text)"""
        )
        cur.execute(
            f"""CREATE OR REPLACE FUNCTION interleaving_log() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO {HISTORY_TABLE} (tbl, op, old, new, at, xid, actor)
              -- A partitioned table's row fires its partition's trigger: logged as the table's.
              VALUES (coalesce((SELECT CAST(CAST(i.inhparent AS regclass) AS text) FROM pg_inherits i
                                WHERE i.inhrelid = TG_RELID), TG_TABLE_NAME), TG_OP,
                      CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
                      CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END,
                      clock_timestamp(), txid_current(), current_setting('interleaving.actor', true));
              RETURN NULL;
            END $$"""
        )
        for table in history_tables().values():
            cur.execute(f"DROP TRIGGER IF EXISTS interleaving_log ON {table}")
            cur.execute(
                f"CREATE CONSTRAINT TRIGGER interleaving_log AFTER INSERT OR UPDATE OR DELETE ON {table}"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION interleaving_log()"
            )
        cur.execute(f"TRUNCATE {HISTORY_TABLE}")


def history_uninstall() -> None:
    with connection.cursor() as cur:
        for table in history_tables().values():
            cur.execute(f"DROP TRIGGER IF EXISTS interleaving_log ON {table}")
        cur.execute(f"DROP TABLE IF EXISTS {HISTORY_TABLE}")


@dataclass
class Event:
    seq: int
    table: str
    op: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    at: datetime  # when its transaction committed (the deferred trigger ran)
    xid: int
    actor: str


# A customer's or a site's key as the invariants compare it (None: no site).
Key = int | str | None


def scope_key(value: Any) -> Key:
    """A customer's or a site's key, spelled one way whichever reader gave it: an
    integer key as an int, any other (a UUID) as PostgreSQL's text. The log's JSON
    gives an integer key as a number, or as text where it is an object's key (a
    drop's per-portfolio counts), and a UUID as text; the ORM and the worlds' objects
    give ``uuid.UUID`` — so the same checks hold for the demo's keys and the UUID
    schema's (tests/settings_uuid.py)."""
    if value is None or isinstance(value, int):
        return value
    text = str(value)
    return int(text) if text.isdigit() else text


def _ts(value: Any) -> datetime | None:
    if value is None:
        return None
    return datetime.fromisoformat(str(value))


@dataclass
class RecordState:
    kind: str
    id: int | str  # a UUID key as PostgreSQL spells it
    portfolio_id: Key  # scope_key's spelling, as every key the invariants compare
    property_id: Key  # None: a kind without a property, or a path row gone
    ts: datetime | None
    document_id: str | None
    integer_key: bool = True

    def after(self, cursor: dict) -> bool:
        """The record's key lies in the ledger row's range ``(after, last]``."""
        if self.integer_key:
            return int(cursor["after_id"]) < int(self.id) <= int(cursor["last_id"])
        after, last = cursor.get("after_key") or "", cursor.get("last_key") or ""
        return after < str(self.id) <= last


@dataclass
class Violations:
    found: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.found.append(text)

    def check(self) -> None:
        assert not self.found, "invariants broken:\n- " + "\n- ".join(self.found)


def drop_commit_timestamps(xids: list[int]) -> dict[int, datetime]:
    """When each transaction of ``xids`` (``txid_current()`` values) committed
    (``track_commit_timestamp``, which the tests' throwaway cluster turns on;
    off, none: the drop's rows are then judged as of its ledger row's insert)."""
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('track_commit_timestamp')")
        if cur.fetchone()[0] != "on":
            return {}
        cur.execute(
            "SELECT x, pg_xact_commit_timestamp(CAST(CAST(x %% 4294967296 AS text) AS xid))"
            " FROM unnest(CAST(%s AS bigint[])) AS x",
            [xids],
        )
        return {int(xid): at for xid, at in cur.fetchall() if at is not None}


class History:
    """The log, read once, with the state of everything at any commit instant."""

    def __init__(self) -> None:
        from retention.registry import REGISTRY, get_spec

        tables = history_tables()
        self.name_of = {table: name for name, table in tables.items()}
        self.columns = {kind: kind_columns(kind) for kind in REGISTRY}
        self.timestamp_column = {kind: get_spec(kind).timestamp_column for kind in REGISTRY}
        self.pk_of = {kind: columns.pk for kind, columns in self.columns.items()}
        self.pk_of |= {path_name(kind): c.path_pk for kind, c in self.columns.items() if c.path_pk}
        with connection.cursor() as cur:
            cur.execute(f"SELECT seq, tbl, op, old, new, at, xid, actor FROM {HISTORY_TABLE} ORDER BY seq")
            rows = cur.fetchall()
        events = []
        for seq, table, op, old, new, at, xid, actor in rows:
            old, new = (json.loads(x) if isinstance(x, str) else x for x in (old, new))
            events.append(Event(seq, self.name_of.get(table, table), op, old, new, at, int(xid), actor or ""))
        # One commit, one instant: the first trigger of a transaction.
        commit_at: dict[int, datetime] = {}
        for event in events:
            commit_at[event.xid] = min(commit_at.get(event.xid, event.at), event.at)
        # A table-partition drop runs SET CONSTRAINTS ALL IMMEDIATE (its pending
        # foreign-key checks would refuse the DROP), which fires this log's
        # deferred triggers at once: its instant is its commit timestamp instead.
        drop_xids = sorted({e.xid for e in events if self.name_of.get(e.table, e.table) == "partition_drop"})
        if drop_xids:
            for xid, at in drop_commit_timestamps(drop_xids).items():
                commit_at[xid] = at
        for event in events:
            event.at = commit_at[event.xid]
        self.events = sorted(events, key=lambda e: (e.at, e.seq))
        self.commit_at = commit_at
        self.by_xid: dict[int, list[Event]] = defaultdict(list)
        for event in self.events:
            self.by_xid[event.xid].append(event)

    # -- state replay ------------------------------------------------------------

    def _rows_at(self, names: Iterable[str], at: datetime | None, *, before: bool = False) -> dict[tuple, dict]:
        """Each row of the ``names`` tables as committed at ``at`` (all events
        of transactions committed at or before it; strictly before with ``before``)."""
        wanted = set(names)
        rows: dict[tuple, dict] = {}
        for event in self.events:
            if event.table not in wanted:
                continue
            if at is not None and (event.at > at or (before and event.at == at)):
                break
            row = event.new if event.op != "DELETE" else event.old
            key = (event.table, row[self.pk_of.get(event.table, "id")])
            if event.op == "DELETE":
                rows.pop(key, None)
            else:
                rows[key] = row
        return rows

    def records_at(self, at: datetime | None, *, before: bool = False) -> dict[tuple[str, Any], RecordState]:
        out = {}
        for (kind, record_id), row in self._rows_at(self.timestamp_column, at, before=before).items():
            out[(kind, record_id)] = self._record(kind, row, at, before=before)
        return out

    def _record(self, kind: str, row: dict, at: datetime | None, *, before: bool = False) -> RecordState:
        """The record ``row`` as the invariants see it at ``at``: a one-hop
        kind's property is its path row's then (a unit moved is a record moved)."""
        c = self.columns[kind]
        prop: Any = row.get(c.property) if c.property else None
        if c.via is not None:
            units = self._rows_at([path_name(kind)], at, before=before)
            unit = units.get((path_name(kind), row.get(c.via)))
            prop = unit.get(c.path_property) if unit else None
        ts = row.get(c.timestamp)
        return RecordState(
            kind=kind,
            id=int(row[c.pk]) if c.integer_key else str(row[c.pk]),
            portfolio_id=scope_key(row[c.portfolio]),
            property_id=scope_key(prop),
            # A DateField's day: its midnight (the product compares the day with the cutoff's).
            ts=datetime.fromisoformat(f"{ts}T00:00:00+00:00") if ts and c.timestamp_is_date else _ts(ts),
            document_id=row.get(c.document) if c.document else None,
            integer_key=c.integer_key,
        )

    def holds_at(self, at: datetime, *, before: bool = False) -> list[dict]:
        return [row for row in self._rows_at(["hold"], at, before=before).values() if row.get("released_at") is None]

    def holds_active_between(self, start: datetime, end: datetime) -> list[dict]:
        """Every hold active at some commit instant in [start, end]."""
        seen: dict[int, dict] = {int(h["id"]): h for h in self.holds_at(start)}
        for event in self.events:
            if event.table == "hold" and start <= event.at <= end and event.op != "DELETE":
                if (event.old or {}).get("released_at") is None:
                    seen[int(event.new["id"])] = event.old or event.new
        return list(seen.values())

    def pauses_at(self, at: datetime, *, before: bool = False) -> list[dict]:
        return [row for row in self._rows_at(["pause"], at, before=before).values() if row.get("resumed_at") is None]

    def active_version_at(self, at: datetime, *, portfolio_id: Key, kind: str) -> dict | None:
        policies = {
            int(row["id"]): row
            for row in self._rows_at(["policy"], None).values()
            if scope_key(row["portfolio_id"]) == portfolio_id and row["record_kind"] == kind
        }
        for row in self._rows_at(["version"], at).values():
            if int(row["policy_id"]) in policies and row["status"] == "approved":
                return row
        return None

    def deletions(self) -> list[tuple[Event, RecordState]]:
        return [
            (e, self._record(e.table, e.old, e.at, before=True))
            for e in self.events
            if e.table in self.timestamp_column and e.op == "DELETE"
        ]

    def named_by_deleted(
        self, document_id: str, at: datetime, *, canonical: Callable[[str], str] = lambda name: name
    ) -> list[RecordState]:
        """Records deleted (committed) at or before ``at`` that named ``document_id``
        (as the store names it) when deleted."""
        return [
            record
            for event, record in self.deletions()
            if event.at <= at and record.document_id and canonical(record.document_id) == document_id
        ]


def hold_covers(hold: dict, record: RecordState) -> bool:
    """The hold rule, restated independently of the product's SQL: its
    customer; no site or the record's (a kind without a site is reached by no
    site's hold); no kind or the record's; no record or this one (by id for an
    integer key, by its text for a UUID)."""
    if record.integer_key:
        names = hold.get("record_id") is None or int(hold["record_id"]) == record.id
    else:
        names = (hold.get("record_key") or "") in ("", str(record.id))
    return (
        scope_key(hold["portfolio_id"]) == record.portfolio_id
        and (hold.get("property_id") is None or scope_key(hold["property_id"]) == record.property_id)
        and (hold.get("record_kind") or "") in ("", record.kind)
        and names
    )


def pause_covers(pause: dict, portfolio_id: Key) -> bool:
    return pause.get("portfolio_id") is None or scope_key(pause["portfolio_id"]) == portfolio_id


@dataclass
class Expectations:
    """What the invariant checker needs beyond the log."""

    cap: int  # CLEANUP_PORTFOLIO_MAX_LEASES
    pipeline_now: Callable[[datetime], datetime]  # the pipeline's (frozen) time at a commit instant
    store_deletes: list[tuple[str, datetime]]  # (document id, when the store applied its DELETE)
    store_documents: set[str]  # what the store still has at the end
    since: datetime  # when the interleaving began (the worker started)
    # The name the store acts on for a record's spelling of its file (a
    # storage's normalised key; the HTTP store's id is itself), and the key of
    # a purge's document reference (``store:key`` for a Django storage).
    canonical: Callable[[str], str] = lambda name: name
    ref_key: Callable[[str], str] = lambda ref: ref
    # A table-partition drop read the pauses after this instant (the trigger
    # was let go from a checkpoint before its decision then): a pause that had
    # committed by then and still stood as the drop committed must have kept
    # the table partition. None: no drop was held before its decision.
    drop_decided_after: datetime | None = None


def check_invariants(history: History, expect: Expectations) -> Violations:
    """Every invariant of the suite over the whole committed history."""
    from cleanup_ops.models import CleanupJob, DocumentDisposition, JobOutcome, LedgerEntry, PurgeRequest

    v = Violations()
    ledger_events = [e for e in history.events if e.table == "ledger" and e.op == "INSERT"]
    ledger_by_xid: dict[int, list[dict]] = defaultdict(list)
    for event in ledger_events:
        ledger_by_xid[event.xid].append(event.new)
    jobs = {
        job.pk: job
        for job in CleanupJob.objects.select_related("sweep").only(
            "id", "cutoff", "sweep__slot", "portfolio_id", "record_kind", "job_kind", "purge_request_id", "outcome"
        )
    }

    # 1. Each row a cleanup deleted: no active hold covered it as its delete
    #    committed; past the stricter of the admitted and the then active
    #    version's cutoffs; never under a withdrawn policy; with a ledger row.
    for event, record in history.deletions():
        if event.actor == "app":
            continue  # the application deleting its own record
        where = f"{record.kind} {record.id} (portfolio {record.portfolio_id}, property {record.property_id})"
        covering = [h for h in history.holds_at(event.at, before=True) if hold_covers(h, record)]
        if covering:
            v.add(f"{where} deleted while hold {covering[0]['id']} covered it")
        entries = [
            row for row in ledger_by_xid.get(event.xid, []) if row["record_kind"] == record.kind and record.after(row)
        ]
        own = [row for row in entries if scope_key(row["property_id"]) == record.property_id]
        if not own:
            others = sorted({str(row["property_id"]) for row in entries})
            v.add(f"{where} deleted by a transaction with no ledger row of its property (others: {others})")
            continue
        entry = own[0]
        job = jobs.get(int(entry["job_id"]))
        version = history.active_version_at(event.at, portfolio_id=record.portfolio_id, kind=record.kind)
        if version is None or not version["enabled"]:
            v.add(f"{where} deleted while its policy was withdrawn (version {version and version['id']})")
        elif job is not None and record.ts is not None:
            stricter = min(job.cutoff, job.sweep.slot - timedelta(days=int(version["retention_days"])))
            if not record.ts < stricter:
                v.add(
                    f"{where} deleted although younger than the stricter cutoff {stricter:%Y-%m-%d}"
                    f" (timestamp {record.ts:%Y-%m-%d}, version {version['id']} active)"
                )
        if record.ts is None or not record.ts < _ts(entry["cutoff"]):
            v.add(f"{where} deleted although not past its ledger row's cutoff {entry['cutoff']}")

    # 2. Ledger rows: held = the rows of the range an active hold covered as it
    #    committed; deleted <= candidates; one row per operation id.
    for event in ledger_events:
        row = event.new
        if int(row["rows_deleted"]) > int(row["candidates"]):
            v.add(f"ledger {row['operation_id'][:12]}: deleted {row['rows_deleted']} > candidates {row['candidates']}")
        # Held by a hold that was there before the case and still is (at
        # least), or by one that was active at some moment since (at most).
        before = {int(h["id"]) for h in history.holds_at(expect.since)}
        holds = [h for h in history.holds_at(event.at) if int(h["id"]) in before]
        ever = history.holds_active_between(expect.since, event.at)
        cutoff = _ts(row["cutoff"])
        in_range = [
            r
            for r in history.records_at(event.at).values()
            if r.kind == row["record_kind"]
            and r.property_id == scope_key(row["property_id"])
            and (r.property_id is not None or r.portfolio_id == scope_key(row["portfolio_id"]))
            and r.after(row)
            and r.ts is not None
            and r.ts < cutoff
        ]
        held = [r for r in in_range if any(hold_covers(h, r) for h in holds)]
        may_be_held = [r for r in in_range if any(hold_covers(h, r) for h in ever)]
        if not len(held) <= int(row["rows_held"]) <= len(may_be_held):
            v.add(
                f"ledger {row['operation_id'][:12]} (job {row['job_id']}): rows_held {row['rows_held']},"
                f" but {len(held)} to {len(may_be_held)} row(s) of its range were under an active hold"
                f" {[r.id for r in may_be_held]}"
            )
    ops = list(LedgerEntry.objects.values_list("operation_id", flat=True))
    if len(ops) != len(set(ops)):
        v.add("an operation id is on the ledger twice")

    # 3. Leases: never more live lease holders per portfolio than the cap; no
    #    lease taken while a pause covered its portfolio; at most one open
    #    delete job per partition — at every commit.
    job_rows: dict[int, dict] = {}
    for xid in sorted(history.commit_at, key=lambda x: history.commit_at[x]):
        at = history.commit_at[xid]
        changed = [e for e in history.by_xid[xid] if e.table == "job"]
        if not changed:
            continue
        pauses = history.pauses_at(at)
        for event in changed:
            new = event.new
            if event.op == "DELETE":
                job_rows.pop(int(event.old["id"]), None)
                continue
            job_rows[int(new["id"])] = new
            old_token = (event.old or {}).get("lease_token")
            if new["state"] == "leased" and new.get("lease_token") != old_token:
                portfolio_id = scope_key(new["portfolio_id"])
                if any(pause_covers(p, portfolio_id) for p in pauses):
                    v.add(f"job {new['id']} leased while a pause covered portfolio {portfolio_id}")
        now = expect.pipeline_now(at)
        holders: dict[Key, set[str]] = defaultdict(set)
        open_partitions: dict[tuple, list[int]] = defaultdict(list)
        for row in job_rows.values():
            if row["state"] == "leased" and row.get("lease_expires_at") and _ts(row["lease_expires_at"]) > now:
                holders[scope_key(row["portfolio_id"])].add(row["lease_token"])
            if row["state"] in ("pending", "leased") and row.get("job_kind", "delete") == "delete":
                open_partitions[(row["portfolio_id"], row["property_id"], row["record_kind"])].append(int(row["id"]))
        for portfolio_id, tokens in holders.items():
            if len(tokens) > expect.cap:
                v.add(f"portfolio {portfolio_id} had {len(tokens)} live lease holders (cap {expect.cap}) at {at}")
        for partition, ids in open_partitions.items():
            if len(ids) > 1:
                v.add(f"partition {partition} had open delete jobs {ids} at once")

    # 4. Files: none deleted by the store while a surviving record named it or
    #    an active hold covered any record, deleted or alive, that named it.
    same = expect.canonical
    for document_id, at in expect.store_deletes:
        alive = [r for r in history.records_at(at).values() if r.document_id and same(r.document_id) == document_id]
        if alive:
            v.add(f"file {document_id} deleted from the store while {alive[0].kind} {alive[0].id} named it")
        named = alive + history.named_by_deleted(document_id, at, canonical=same)
        holds = history.holds_at(at)
        covering = [(h, r) for r in named for h in holds if hold_covers(h, r)]
        if covering:
            hold, record = covering[0]
            v.add(
                f"file {document_id} deleted from the store while hold {hold['id']} covered {record.kind} {record.id}"
            )

    # 5. The proof: a document counted as set aside is a file the store still has.
    dispositions = dict(DocumentDisposition.objects.values_list("document_id", "state"))
    for request in PurgeRequest.objects.all():
        for document_id in request.held_document_ids:
            if expect.ref_key(document_id) not in expect.store_documents and dispositions.get(document_id) != "purged":
                v.add(f"purge request {request.pk} says {document_id} is set aside; the store no longer has it")
        if request.documents_held > len(set(request.document_ids)):
            v.add(f"purge request {request.pk} counts {request.documents_held} held of {len(request.document_ids)}")
    for job in jobs.values():
        if job.outcome == JobOutcome.PURGE_HELD and job.purge_request_id:
            request = PurgeRequest.objects.get(pk=job.purge_request_id)
            if request.documents_held == 0:
                v.add(f"purge job {job.pk} ended purge_held with nothing set aside")
            missing = [d for d in request.held_document_ids if expect.ref_key(d) not in expect.store_documents]
            if missing and all(dispositions.get(d) != "purged" for d in missing):
                v.add(f"purge job {job.pk} ended purge_held but the store no longer has {missing}")

    # 6. Table-partition drops (no row trigger fires for a DROP TABLE: the rows
    #    are those of the kind whose timestamp lay in its bounds as it
    #    committed): none under an active hold; each portfolio's rows past the
    #    cutoff of the version active as it committed, which is the version
    #    its ledger row names; never under a withdrawn policy or a pause it
    #    should have seen; its counts are the rows that were in it.
    drops = [e for e in history.events if e.table == "partition_drop" and e.op == "INSERT"]
    for event in drops:
        drop = event.new
        name, kind = drop["table_partition"], drop["record_kind"]
        lower, upper, slot = _ts(drop["lower_bound"]), _ts(drop["upper_bound"]), _ts(drop["slot"])
        inside = [
            r
            for r in history.records_at(event.at, before=True).values()
            if r.kind == kind and r.ts is not None and (lower is None or lower <= r.ts) and r.ts < upper
        ]
        for record in inside:
            covering = [h for h in history.holds_at(event.at, before=True) if hold_covers(h, record)]
            if covering:
                v.add(
                    f"table partition {name} dropped with {kind} {record.id} (portfolio {record.portfolio_id},"
                    f" property {record.property_id}) while hold {covering[0]['id']} covered it"
                )
        per_portfolio: dict[Key, int] = defaultdict(int)
        for record in inside:
            per_portfolio[record.portfolio_id] += 1
        named = {scope_key(p): entry for p, entry in (drop["portfolios"] or {}).items()}
        if int(drop["rows"]) != len(inside) or {p: int(e["rows"]) for p, e in named.items()} != dict(per_portfolio):
            v.add(
                f"table partition {name}: its ledger row counts {drop['rows']} rows {named},"
                f" {len(inside)} were in it as it committed {dict(per_portfolio)}"
            )
        for portfolio_id in per_portfolio:
            version = history.active_version_at(event.at, portfolio_id=portfolio_id, kind=kind)
            if version is None or not version["enabled"]:
                v.add(f"table partition {name} dropped while portfolio {portfolio_id}'s policy was withdrawn")
                continue
            cutoff = slot - timedelta(days=int(version["retention_days"]))
            young = [r for r in inside if r.portfolio_id == portfolio_id and r.ts is not None and not r.ts < cutoff]
            if young:
                v.add(
                    f"table partition {name} dropped with {kind} {young[0].id} of portfolio {portfolio_id},"
                    f" younger than its cutoff {cutoff:%Y-%m-%d} (version {version['id']} active as it committed)"
                )
            entry = named.get(portfolio_id)
            if entry is not None and int(entry["policy_version_id"]) != int(version["id"]):
                v.add(
                    f"table partition {name} dropped under version {entry['policy_version_id']} of portfolio"
                    f" {portfolio_id}; version {version['id']} was active as it committed"
                )
            if expect.drop_decided_after is not None:
                seen = {int(p["id"]) for p in history.pauses_at(expect.drop_decided_after)}
                standing = [
                    p
                    for p in history.pauses_at(event.at, before=True)
                    if int(p["id"]) in seen and pause_covers(p, portfolio_id)
                ]
                if standing:
                    v.add(
                        f"table partition {name} dropped with portfolio {portfolio_id}'s rows although pause"
                        f" {standing[0]['id']} had committed before the drop read the pauses"
                    )
    names = [e.new["table_partition"] for e in drops]
    if len(names) != len(set(names)):
        v.add(f"a table partition is on the drops' ledger twice: {sorted(names)}")
    return v
