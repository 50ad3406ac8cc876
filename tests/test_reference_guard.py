"""The reference guard (cleanup_ops.downstream.guard): a record that starts naming
a document takes part in that document's one decision."""

from __future__ import annotations

import threading
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql as pg

from cleanup_ops import checkpoints
from cleanup_ops.downstream.guard import FUNCTION, guard_arguments, guarded_kinds, guards_install, trigger_name
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import CleanupJob, DispositionState, DocumentDisposition, JobKind
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease

from .conftest import make_records, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


@pytest.mark.django_db
def test_migrate_guards_every_managed_record_table_with_an_attachment():
    with connection.cursor() as cur:
        cur.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'cleanup_ops_guard_%' ORDER BY tgname")
        names = [row[0] for row in cur.fetchall()]
    assert names == ["cleanup_ops_guard_lease", "cleanup_ops_guard_maintenance_record"]


def guard_triggers() -> dict[str, tuple[int, list[str]] | None]:
    """Each guarded kind's trigger on its record table: its oid and arguments (None: missing)."""
    with connection.cursor() as cur:
        return {trigger_name(spec): guard_arguments(spec, cur=cur) for spec in guarded_kinds()}


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["current", "missing", "different"])
def test_installing_the_guards_again_replaces_only_a_trigger_that_is_missing_or_different(state):
    """A current trigger is left alone: replacing it would lock its table and every table
    partition and invalidate every plan over them, at every migrate."""
    before = guard_triggers()
    spec = guarded_kinds()[0]
    name = trigger_name(spec)
    with connection.cursor() as cur:
        if state != "current":
            cur.execute(pg.SQL("DROP TRIGGER {} ON {}").format(pg.Identifier(name), pg.Identifier(spec.table)))
        if state == "different":
            cur.execute(
                pg.SQL("CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}('elsewhere')").format(
                    pg.Identifier(name), pg.Identifier(spec.table), pg.Identifier(FUNCTION)
                )
            )

    assert sorted(guards_install()) == sorted(s.kind for s in guarded_kinds())

    after = guard_triggers()
    assert None not in after.values() and None not in before.values()
    assert {n: found[1] for n, found in after.items()} == {n: found[1] for n, found in before.items()}
    replaced = {n for n, found in after.items() if found[0] != before[n][0]}
    assert replaced == (set() if state == "current" else {name})


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_record_that_names_a_purged_document_again_gives_it_a_fresh_decision(
    portfolio, prop, active_policy, docstore
):
    active_policy(portfolio, "lease", 365)
    (first,) = make_records(prop, "lease", 1, ended=OLD)
    Lease.objects.filter(pk=first).update(document_id="contract-7")
    docstore.create("contract-7")
    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()
    assert DocumentDisposition.objects.get(document_id="contract-7").state == DispositionState.PURGED

    (again,) = make_records(prop, "lease", 1, ended=NOW)
    Lease.objects.filter(pk=again).update(document_id="contract-7")

    disposition = DocumentDisposition.objects.get(document_id="contract-7")
    assert (disposition.state, disposition.decided_by_id) == (DispositionState.PENDING, None)


@pytest.mark.django_db
def test_an_edit_that_keeps_the_document_leaves_its_decision_alone(portfolio, prop):
    (record,) = make_records(prop, "lease", 1, ended=OLD)
    Lease.objects.filter(pk=record).update(document_id="contract-8")
    # Naming it created the document's decision row; say it was purged since.
    DocumentDisposition.objects.filter(document_id="contract-8").update(state=DispositionState.PURGED)
    Lease.objects.filter(pk=record).update(ended_at=NOW)  # document unchanged: not named anew
    assert DocumentDisposition.objects.get(document_id="contract-8").state == DispositionState.PURGED


def _raw() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def _poll(observer: psycopg.Connection, query: str, args: list[object], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not observer.execute(query, args).fetchone()[0]:
        assert time.monotonic() < deadline, f"not reached: {query}"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
def test_a_record_named_while_the_purge_decides_waits_for_the_decision(
    portfolio, prop, active_policy, docstore, settings
):
    active_policy(portfolio, "lease", 365)
    (first,) = make_records(prop, "lease", 1, ended=OLD)
    Lease.objects.filter(pk=first).update(document_id="contract-9")
    docstore.create("contract-9")
    sweep_trigger(slot=SLOT, now=NOW)
    job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE).pk)
    purge = CleanupJob.objects.get(job_kind=JobKind.PURGE)
    (young,) = make_records(prop, "lease", 1, ended=NOW)

    settings.CLEANUP_CHECKPOINTS = frozenset({"purge.before_store_call"})
    key = checkpoints.checkpoint_key("purge.before_store_call")
    holder, observer, application = _raw(), _raw(), _raw()
    holder.execute("SELECT pg_advisory_lock(%s, %s)", [checkpoints.CHECKPOINT_NAMESPACE, key])

    def work() -> None:
        try:
            job_run_slice(job_id=purge.pk)
        finally:
            checkpoints.close_side_connection()
            connections.close_all()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        # The purge decided (no record names the file) and waits before its store call.
        _poll(
            observer,
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s"
            " AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            [checkpoints.CHECKPOINT_NAMESPACE, key],
        )
        # The application starts naming the document: the guard makes it wait for the decision.
        pid = application.info.backend_pid
        named = threading.Thread(
            target=lambda: application.execute(
                "UPDATE properties_lease SET document_id = 'contract-9' WHERE id = %s", [young]
            )
        )
        named.start()
        _poll(observer, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid])
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", [checkpoints.CHECKPOINT_NAMESPACE, key])
    worker.join(30)
    named.join(30)
    for conn in (holder, observer, application):
        conn.close()

    # The file went under a decision that saw no record naming it; the record
    # that named it meanwhile committed after, and reopened the decision.
    assert docstore.documents() == set()
    assert Lease.objects.get(pk=young).document_id == "contract-9"
    assert DocumentDisposition.objects.get(document_id="contract-9").state == DispositionState.PENDING


def test_print_sql_names_the_function_and_each_trigger(db):  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("cleanup_reference_guard", "--print-sql", stdout=out)
    text = out.getvalue()
    # Names are quoted identifiers (cleanup_ops.sql.composed).
    assert 'CREATE OR REPLACE FUNCTION "cleanup_ops_document_named"()' in text
    assert (
        'CREATE TRIGGER "cleanup_ops_guard_lease" BEFORE INSERT OR UPDATE OF "document_id" ON "properties_lease"'
        in text
    )
