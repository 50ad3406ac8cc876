"""The chaos run's before/after checks (run in-process against its database)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone
from psycopg import sql as pg

from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry
from cleanup_ops.schedule import slot_current
from retention.eligibility import db_datetime, hold_covers_sql
from retention.models import PolicyVersion
from retention.registry import REGISTRY


@dataclass
class Before:
    eligible: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # kind -> {(id, property_id)}
    held: dict[str, set[int]] = field(default_factory=dict)
    held_documents: set[str] = field(default_factory=set)
    totals: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return ", ".join(
            f"{kind}: {self.totals[kind]} rows, {len(self.eligible[kind])} eligible, {len(self.held[kind])} held"
            for kind in REGISTRY
        )


@dataclass
class Result:
    name: str
    ok: bool
    detail: str


def snapshot_before() -> Before:
    slot = slot_current()
    before = Before()
    versions = PolicyVersion.objects.filter(status="approved", enabled=True).values_list(
        "policy__portfolio_id", "policy__record_kind", "retention_days"
    )
    for kind, spec in REGISTRY.items():
        before.eligible[kind], before.held[kind] = set(), set()
        before.totals[kind] = spec.model.objects.count()
        hold_sql, hold_params = hold_covers_sql(kind)
        has_docs = any(f.name == "document_id" for f in spec.model._meta.fields)
        doc = pg.SQL("r.document_id" if has_docs else "''")
        for portfolio_id, version_kind, days in versions:
            if version_kind != kind:
                continue
            with connection.cursor() as cur:
                cur.execute(
                    pg.SQL(
                        """
                        SELECT r.id, r.property_id, {held}, {doc} FROM {table} r
                        WHERE r.portfolio_id = %s AND r.{ts} < %s
                        """
                    ).format(
                        held=hold_sql,
                        doc=doc,
                        table=pg.Identifier(spec.table),
                        ts=pg.Identifier(spec.timestamp_column),
                    ),
                    [*hold_params, portfolio_id, db_datetime(slot - timedelta(days=days))],
                )
                for record_id, property_id, held, document_id in cur.fetchall():
                    if held:
                        before.held[kind].add(record_id)
                        if document_id:
                            before.held_documents.add(document_id)
                    else:
                        before.eligible[kind].add((record_id, property_id))
    return before


def open_jobs() -> int:
    return CleanupJob.objects.open().count()


def drain_figures(before: Before) -> dict[str, int]:
    """Rows in the tables before, eligible, deleted, left in open dead letters, held (and kept)."""
    open_letters = set(DeadLetter.objects.filter(status="open").values_list("property_id", "record_kind"))
    figures = {"rows": sum(before.totals.values()), "eligible": 0, "deleted": 0, "in_dead_letters": 0, "held": 0}
    for kind, spec in REGISTRY.items():
        remaining = set(spec.model.objects.values_list("id", flat=True))
        figures["eligible"] += len(before.eligible[kind])
        figures["held"] += len(before.held[kind])
        for record_id, property_id in before.eligible[kind]:
            if record_id not in remaining:
                figures["deleted"] += 1
            elif (property_id, kind) in open_letters:
                figures["in_dead_letters"] += 1
    return figures


def checks(before: Before, *, store_requests: list[dict[str, object]]) -> list[Result]:
    results = []
    open_letters = set(DeadLetter.objects.filter(status="open").values_list("property_id", "record_kind"))
    unaccounted, held_gone, gone_total = 0, 0, 0
    for kind, spec in REGISTRY.items():
        remaining = set(spec.model.objects.values_list("id", flat=True))
        gone_total += before.totals[kind] - len(remaining)
        unaccounted += sum(
            1
            for record_id, property_id in before.eligible[kind]
            if record_id in remaining and (property_id, kind) not in open_letters
        )
        held_gone += len(before.held[kind] - remaining)
    results.append(
        Result(
            "every eligible record deleted or in an open dead letter",
            unaccounted == 0,
            f"{unaccounted} eligible records left without an open dead letter",
        )
    )
    results.append(Result("no held record deleted", held_gone == 0, f"{held_gone} held records deleted"))
    duplicates = LedgerEntry.objects.values("operation_id").annotate(n=Count("id")).filter(n__gt=1).count()
    results.append(Result("no operation id twice in the ledger", duplicates == 0, f"{duplicates} duplicated"))
    ledger_total = LedgerEntry.objects.aggregate(n=Sum("rows_deleted"))["n"] or 0
    results.append(
        Result(
            "ledger total equals records gone",
            ledger_total == gone_total,
            f"ledger {ledger_total}, records gone {gone_total}",
        )
    )
    stale = CleanupJob.objects.expired_leases(now=timezone.now()).count()
    results.append(Result("no job left leased past its lease expiry", stale == 0, f"{stale} stale leases"))
    applied = Counter(
        r["key"]
        for r in store_requests
        if r.get("method") == "DELETE" and r.get("status") == 204 and not r.get("replayed")
    )
    twice = sum(1 for n in applied.values() if n > 1)
    paths = Counter(
        r["path"]
        for r in store_requests
        if r.get("method") == "DELETE" and r.get("status") == 204 and not r.get("replayed")
    )
    held_purged = sum(1 for path in paths if str(path).rsplit("/", 1)[-1] in before.held_documents)
    results.append(
        Result(
            "no purge applied twice for one key",
            twice == 0 and max(paths.values(), default=0) <= 1,
            f"{twice} keys applied twice, {len(applied)} purges applied",
        )
    )
    results.append(Result("no held record's file purged", held_purged == 0, f"{held_purged} held files purged"))
    return results
