"""The ledger's hash chains: a removed, altered or reordered ledger row is found.

**What is chained.** Every ``LedgerEntry`` row belongs to its portfolio's
chain (``portfolio:<id>``), every ``TablePartitionDrop`` row to one chain of
drops (``table_partitions``: a drop spans portfolios). A row carries
``prev_id`` and ``prev_hash`` — its chain's previous row's id and hash (NULL
and ``""`` for the first) — and ``entry_hash``: sha256 (hex) of the UTF-8 of
its parts, each spelled ``<length>:<text>;`` (a NULL ``-;``), so no two lists
of parts share a text: a tag (``ledger-entry-v1``), the id, ``prev_id``,
``prev_hash`` and every field of the row (``proof_verify.LEDGER_ENTRY_PARTS``,
``proof_verify.TABLE_PARTITION_DROP_PARTS``; times in UTC with microseconds).
The formulas are ``cleanup_ops.proof_verify``'s (the offline verifier
recomputes a proof's rows with them) and the database's functions of
migration 0022 (``cleanup_ops_ledger_entry_hash``); the tests check the two
give one hash. No record content is hashed or stored: the ledger holds
identifiers, ranges and counts only.

**Who writes it, under which lock.** The database, as the row is inserted:
a ``BEFORE INSERT`` trigger on each table locks the chain's head row
(``LedgerChainHead``, created the first time) ``FOR UPDATE``, links the row to
the head, hashes it and moves the head to it — in the statement that inserts
the row, so in the batch's own transaction
(``cleanup_ops.execution.statements.ledger_insert_and_jobs_advance``, the drop's transaction in
``cleanup_ops.table_partitions``) and with no round trip more. Two
transactions writing to one chain take turns on the head's lock until the
first commits, so the second links to the first's row and the chain never
forks; a rolled-back batch takes its head move with it. One chain per
portfolio so that batches of different portfolios never wait on one head
and a customer's proof covers its own chain; a group transaction inserts its
rows in portfolio order, so two groups take their heads in one order. A row
whose sequence id was drawn before a concurrent writer's row that linked first
draws its id again under the lock: a chain's rows are in id order.

**What it proves.** ``verify_chains`` (``manage.py cleanup_ledger_verify``)
walks each chain in id order and recomputes: a row removed is named by the
row after it (its ``prev_id`` is gone) or by the head; an altered row's hash
no longer recomputes (or, re-hashed by whoever altered it, the next row or
the head holds another hash); a reordered row links to a row that is not the
one before it. A privileged user who rewrites a whole chain from a row on,
head included, is not seen by the chain alone: the signed proofs of
disposition name the heads as they were (``cleanup_ops.proof``), so a proof
issued before the rewrite no longer matches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from psycopg import sql as pg

from cleanup_ops.models import LedgerChainHead, LedgerEntry, TablePartitionDrop
from cleanup_ops.proof_verify import (
    LEDGER_ENTRY_PARTS,
    TABLE_PARTITION_DROP_PARTS,
    ledger_entry_hash,
    table_partition_drop_hash,
)

DROPS_CHAIN = "table_partitions"
BACKFILL_FUNCTION = "cleanup_ops_ledger_chain_backfill"
CHUNK = 5000


def _n(count: int, noun: str) -> str:
    """``_n(1, "row")`` → "1 row", ``_n(2, "row")`` → "2 rows": never a "(s)"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def portfolio_chain(portfolio_id: int) -> str:
    """The chain a portfolio's ledger rows are linked in (``LedgerChainHead.chain``)."""
    return f"portfolio:{portfolio_id}"


@dataclass
class ChainReport:
    """What ``verify_chains`` found: chains and rows walked, and each problem, first first."""

    chains: int = 0
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    first_row: int | None = None  # the id of the row the first problem names

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, row_id: int | None, text: str) -> None:
        if self.first_row is None and not self.problems:
            self.first_row = row_id
        self.problems.append(text)

    def summary(self) -> str:
        verdict = "verified" if self.ok else f"FAILED ({_n(len(self.problems), 'problem')})"
        return f"{verdict}: {_n(self.chains, 'chain')}, {_n(self.rows, 'row')} recomputed"


def verify_chains(*, portfolio_id: int | None = None) -> ChainReport:
    """Walk every chain (only ``portfolio_id``'s, when given; the drops' chain
    only without it) and recompute it against its head. Reads, never writes,
    so it runs beside the workers: called outside a transaction, it reads
    the heads and the rows in one snapshot (REPEATABLE READ), so a batch
    committing meanwhile is either wholly in it or not at all."""
    if connection.in_atomic_block:
        return _verify_chains(portfolio_id)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(pg.SQL("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
        return _verify_chains(portfolio_id)


def _verify_chains(portfolio_id: int | None) -> ChainReport:
    report = ChainReport()
    heads = {head.chain: head for head in LedgerChainHead.objects.all()}
    entries = (
        LedgerEntry.objects.all() if portfolio_id is None else LedgerEntry.objects.filter(portfolio_id=portfolio_id)
    )
    ids: dict[str, set[int]] = {}
    for portfolio, row_id in entries.values_list("portfolio_id", "id").iterator(chunk_size=CHUNK):
        ids.setdefault(portfolio_chain(portfolio), set()).add(row_id)
    rows = entries.order_by("portfolio_id", "id").values(*LEDGER_ENTRY_PARTS, "entry_hash").iterator(chunk_size=CHUNK)
    walked = _walk(report, rows, chain_of=lambda row: portfolio_chain(row["portfolio_id"]), ids=ids, heads=heads)
    if portfolio_id is None:
        drops = (
            TablePartitionDrop.objects.order_by("id")
            .annotate(portfolios_text=Cast("portfolios", TextField()))
            .values(
                *(name for name in TABLE_PARTITION_DROP_PARTS if name != "portfolios"), "portfolios_text", "entry_hash"
            )
        )
        drop_ids = {DROPS_CHAIN: set(TablePartitionDrop.objects.values_list("id", flat=True))}
        walked |= _walk(
            report,
            _as_drops(drops.iterator(chunk_size=CHUNK)),
            chain_of=lambda _: DROPS_CHAIN,
            ids=drop_ids,
            heads=heads,
        )
    # A chain whose every row is gone still has its head.
    for chain, head in sorted(heads.items()):
        in_scope = portfolio_id is None or chain == portfolio_chain(portfolio_id)
        if in_scope and chain not in walked and head.entry_id:
            report.chains += 1
            report.problem(
                head.entry_id, f"{chain}: row {head.entry_id} was removed (the chain's head names it; no row is left)"
            )
    return report


def _as_drops(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for row in rows:
        row["portfolios"] = row.pop("portfolios_text")
        row["kind"] = "drop"
        yield row


def _walk(
    report: ChainReport,
    rows: Iterator[dict[str, Any]],
    *,
    chain_of: Callable[[dict[str, Any]], str],
    ids: dict[str, set[int]],
    heads: dict[str, LedgerChainHead],
) -> set[str]:
    """Walk ``rows`` (chain by chain, each in id order); returns the chains seen."""
    seen: set[str] = set()
    chain: str | None = None
    before: dict[str, Any] | None = None
    count = 0
    for row in rows:
        current = chain_of(row)
        if current != chain:
            if chain is not None:
                _end(report, chain, before, count, heads)
            chain, before, count = current, None, 0
            seen.add(current)
            report.chains += 1
        report.rows += 1
        count += 1
        _check(report, current, row, before, ids[current])
        before = row
    if chain is not None:
        _end(report, chain, before, count, heads)
    return seen


def _check(report: ChainReport, chain: str, row: dict[str, Any], before: dict[str, Any] | None, ids: set[int]) -> None:
    """One row against the one before it in its chain, then its own hash."""
    row_id = row["id"]
    if row["entry_hash"] is None:
        report.problem(row_id, f"{chain}: row {row_id} is not linked (written before the chain and not backfilled)")
        return
    expected = None if before is None else before["id"]
    if row["prev_id"] != expected:
        if row["prev_id"] is not None and row["prev_id"] not in ids:
            report.problem(
                row["prev_id"], f"{chain}: row {row['prev_id']} was removed (row {row_id} names it as its previous row)"
            )
        else:
            report.problem(
                row_id,
                f"{chain}: row {row_id} was reordered "
                f"(it follows row {row['prev_id']}; the row before it is {expected})",
            )
    elif before is not None and row["prev_hash"] != before["entry_hash"]:
        report.problem(
            before["id"], f"{chain}: row {before['id']} was altered (row {row_id} holds another hash for it)"
        )
    recomputed = table_partition_drop_hash(row) if row.get("kind") == "drop" else ledger_entry_hash(row)
    if recomputed != row["entry_hash"]:
        report.problem(row_id, f"{chain}: row {row_id} was altered (its hash does not recompute)")


def _end(
    report: ChainReport, chain: str, last: dict[str, Any] | None, count: int, heads: dict[str, LedgerChainHead]
) -> None:
    """The chain's last row against its head."""
    if last is None:
        return
    head = heads.get(chain)
    if head is None:
        report.problem(last["id"], f"{chain}: no head (the chain-head row was removed)")
        return
    if head.entry_id > last["id"]:
        report.problem(head.entry_id, f"{chain}: row {head.entry_id} was removed (the chain's head names it)")
    elif head.entry_id < last["id"]:
        report.problem(
            last["id"], f"{chain}: row {last['id']} is after the chain's head {head.entry_id} (not linked by it)"
        )
    elif head.entry_hash != last["entry_hash"]:
        report.problem(
            last["id"], f"{chain}: row {last['id']} was altered (the chain's head holds another hash for it)"
        )
    elif head.entries != count:
        report.problem(last["id"], f"{chain}: {_n(count, 'row')}, its head linked {head.entries}: a row was removed")


def backfill() -> int:
    """Link the rows written before the chain existed (``entry_hash`` NULL),
    chain by chain in id order; the rows linked. Migration 0022 runs it; it
    is the database's function, so the backfill hashes as the trigger does."""
    with connection.cursor() as cur:
        cur.execute(pg.SQL("SELECT {function}()").format(function=pg.Identifier(BACKFILL_FUNCTION)))
        (linked,) = cur.fetchone()
    return int(linked)
