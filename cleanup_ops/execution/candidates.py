"""Step d of the batch transaction (``execution.batches``): count the candidates
of the partitions a transaction takes, choose those that fit, delete.

Apart from the protocol because the counting is its own subject: it decides
which partitions fit in one transaction's rows, costs statements, and is
done one of three ways (``Counting``) by how many partitions there are; and
the DELETE's bookkeeping (held rows counted in its snapshot, the documents
its rows named) is read with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from functools import cache
from typing import Any, Protocol

from cleanup_ops import sql
from cleanup_ops.execution import statements
from retention.conf import MAX_BATCH_SIZE
from retention.eligibility import db_datetime
from retention.registry import RecordKindSpec, get_spec

Key = int | str  # a cursor: an integer key, or a non-integer one's text ("" before the first)


class PartitionJob(Protocol):
    """What the count and the DELETE read of a partition's job (``execution.batches.JobRef``)."""

    id: int
    portfolio_id: int
    property_id: int | None
    record_kind: str


# How a transaction counts the candidates of the partitions it takes. The
# count comes first — it decides which partitions fit in one transaction's
# rows — and costs statements, so the way depends on how many partitions
# there are.
class Counting(Enum):
    # A few partitions: the first partition's candidates and its
    # DELETE in one statement (``partition_count_and_delete``). Alone, a large
    # partition's batch is the whole transaction's data work.
    WITH_ITS_DELETE = "with its delete"
    # One statement per partition (``partition_candidates``), until a batch of
    # rows is found: planned with the partition's own values, it walks the
    # keyset index instead of sorting every expired row of the property (as a
    # generic plan does).
    PER_PARTITION = "per partition"
    # Many partitions of one kind: one lateral statement for all of
    # them (``group_candidates``): one round trip, a generic plan.
    LATERAL = "lateral"


# Up to this many partitions, one statement each is cheaper than the generic
# plan of the lateral statement (the keyset walk, see ``Counting``); past
# it, the round trips cost more than the plan.
PER_PARTITION_COUNTS_UP_TO = 4


def first_partition_counting(fresh: int) -> Counting:
    """How the first of ``fresh`` partitions to delete from is counted: with its
    DELETE when there are few, else like the others of its kind."""
    if fresh <= PER_PARTITION_COUNTS_UP_TO:
        return Counting.WITH_ITS_DELETE
    return Counting.PER_PARTITION


def kind_counting(partitions: int) -> Counting:
    """How the ``partitions`` of one kind left after the first are counted."""
    if partitions > PER_PARTITION_COUNTS_UP_TO:
        return Counting.LATERAL
    return Counting.PER_PARTITION


@dataclass
class PartitionBatch:
    """One partition's next batch: planned by ``execution.batches`` (range,
    limit, operation id), then filled in by the count and the DELETE."""

    job: PartitionJob
    after_id: Key
    cutoff: datetime
    version_id: int
    limit: int = MAX_BATCH_SIZE  # this partition's batch size
    operation: str = ""
    candidates: int = 0  # counted to choose the range: (after_id, last_id]
    last_id: Key | None = None
    counted: bool = False
    # The candidates' ids: what the group DELETE deletes from,
    # and their lowest and highest retention timestamp, which it keeps to.
    ids: list[Any] | None = None
    ts_lo: Any = None
    ts_hi: Any = None
    # What the ledger says: the candidates, and of those the ones a hold
    # covers, counted in the DELETE's own snapshot.
    in_range: int = 0
    held: int = 0


Documents = dict[int, list[tuple[str, Key]]]  # per job: (document id, record id) of each deleted record


# The column a table is PARTITION BY RANGE on, when it is that one alone.
RANGE_KEY = (
    "SELECT a.attname FROM pg_partitioned_table pt JOIN pg_attribute a ON a.attrelid = pt.partrelid"
    " AND a.attnum = pt.partattrs[0] WHERE pt.partrelid = to_regclass(%s) AND pt.partstrat = 'r' AND pt.partnatts = 1"
)


def pruning(spec: RecordKindSpec) -> bool:
    """Whether the DELETE keeps to its candidates' span of timestamps
    (``statements._and_in_span``): when the kind's table is
    ``PARTITION BY RANGE`` on its timestamp."""
    return _range_key(spec.table) == spec.timestamp_column


@cache
def _range_key(table: str) -> str | None:
    # Read once per process: a table is partitioned when it is made, and a
    # change meanwhile costs only the pruning (the span only narrows).
    found = sql.execute(RANGE_KEY, [table])
    return str(found[0][0]) if found else None


def count_and_delete(
    cur: Any, fresh: list[PartitionBatch], *, budget: int
) -> tuple[list[PartitionBatch], dict[int, int], Documents]:
    """Step d: count the candidates (``Counting``), take the partitions in
    order while their candidates fit in ``budget`` rows (the first always
    goes), and delete from those taken. Returns (the partitions taken, rows
    deleted per job, documents per job)."""
    chosen: list[PartitionBatch] = []
    taken = 0
    deleted: dict[int, int] = {}
    documents: Documents = {}
    rest = fresh
    if fresh and first_partition_counting(len(fresh)) is Counting.WITH_ITS_DELETE:
        first, rest = fresh[0], fresh[1:]
        deleted, documents = _count_and_delete_alone(cur, first)
        chosen, taken = [first], first.candidates
        if taken >= budget:
            rest = []
    _count_candidates(cur, rest, budget=budget - taken)
    to_delete = []
    for item in rest:
        if not item.counted or (item.candidates and chosen and taken + item.candidates > budget):
            continue  # next transaction: this one is full
        taken += item.candidates
        chosen.append(item)
        if item.candidates:
            to_delete.append(item)
    more_deleted, more_documents = _delete(cur, to_delete)
    return chosen, deleted | more_deleted, documents | more_documents


def _count_candidates(cur: Any, work: list[PartitionBatch], *, budget: int) -> None:
    """Fill in candidates (up to its own limit per partition) and the last
    candidate id of as many partitions, in order, as one transaction's rows
    (``budget``) cover; the others stay uncounted (``counted`` False) for the
    next transaction. Per kind, ``kind_counting`` says how."""
    by_kind: dict[str, list[PartitionBatch]] = {}
    for item in work:
        by_kind.setdefault(item.job.record_kind, []).append(item)
    for kind, items in by_kind.items():
        if kind_counting(len(items)) is Counting.LATERAL:
            _count_lateral(cur, get_spec(kind), items, budget=budget)
        else:
            _count_per_partition(cur, get_spec(kind), items, budget=budget)


def _count_lateral(cur: Any, spec: RecordKindSpec, items: list[PartitionBatch], *, budget: int) -> None:
    """``Counting.LATERAL``: one statement, at most ``budget`` + 1 rows in all;
    the partition the global limit cut short stays uncounted."""
    rows = [
        {
            "ord": ord_,
            "job_id": item.job.id,
            "property_id": item.job.property_id,
            "portfolio_id": item.job.portfolio_id,
            "after_id": item.after_id,
            "cutoff": db_datetime(item.cutoff),
            "lim": item.limit,
        }
        for ord_, item in enumerate(items)
    ]
    statement = statements.group_candidates(spec)
    params = {**sql.rows_params("g", statements.candidate_columns(spec), rows), "budget": budget + 1}
    found = sql.execute(statement, params, cur=cur).fetchall()
    returned = sum(int(rows) for _, _, rows, *_ in found)
    reached = max((int(ord_) for ord_, *_ in found), default=-1)
    cut = reached if returned > budget else None
    for ord_, _job_id, _rows, n, last, ids, ts_lo, ts_hi in found:
        if ord_ != cut:
            item = items[ord_]
            item.candidates, item.last_id, item.ids, item.counted = int(n), last, ids or [], True
            item.ts_lo, item.ts_hi = ts_lo, ts_hi


def _count_per_partition(cur: Any, spec: RecordKindSpec, items: list[PartitionBatch], *, budget: int) -> None:
    """``Counting.PER_PARTITION``: one statement per partition, in order, until
    ``budget`` rows are found."""
    statement = statements.partition_candidates(spec)
    seen = 0
    for item in items:
        if seen >= budget:
            break
        params = {
            "property_id": item.job.property_id,
            "after_id": item.after_id,
            "cutoff": db_datetime(item.cutoff),
            "lim": item.limit,
        }
        if not spec.has_property:
            params["portfolio_id"] = item.job.portfolio_id
        n, last, ids, item.ts_lo, item.ts_hi = sql.execute(statement, params, cur=cur).fetchone()
        item.candidates, item.last_id, item.ids, item.counted = int(n), last, ids, True
        seen += int(n)


def _count_and_delete_alone(cur: Any, item: PartitionBatch) -> tuple[dict[int, int], dict[int, list[tuple[str, Key]]]]:
    """``_count_candidates`` and ``_delete`` for one partition in one statement:
    fills in its candidates and last id; returns what
    ``_delete`` returns."""
    kind = item.job.record_kind
    spec = get_spec(kind)
    attachment = attachment_column(kind)
    statement = statements.partition_count_and_delete(spec, pruning=pruning(spec))
    params = {
        "property_id": item.job.property_id,
        "portfolio_id": item.job.portfolio_id,
        "after_id": item.after_id,
        "cutoff": db_datetime(item.cutoff),
        "lim": item.limit,
        "kind": kind,
    }
    deleted = 0
    named: list[tuple[str, Key]] = []
    for candidates, last_id, record_id, document_id in sql.execute(statement, params, cur=cur).fetchall():
        if candidates is not None:
            item.candidates, item.last_id, item.counted = int(candidates), last_id, True
            # One statement, one snapshot: the range is exactly the candidates
            # (the first row's third column is the held count).
            item.in_range, item.held = int(candidates), int(record_id)
            continue
        deleted += 1
        if attachment and document_id:
            named.append((document_id, spec.key_value(record_id)))
    return ({item.job.id: deleted} if deleted else {}), ({item.job.id: named} if named else {})


def _delete(cur: Any, work: list[PartitionBatch]) -> tuple[dict[int, int], dict[int, list[tuple[str, Key]]]]:
    """One DELETE per record kind; (rows deleted per job, (document id, record id) per job)."""
    deleted: dict[int, int] = {}
    documents: dict[int, list[tuple[str, Key]]] = {}
    by_kind: dict[str, list[PartitionBatch]] = {}
    for item in work:
        by_kind.setdefault(item.job.record_kind, []).append(item)
    for kind, items in by_kind.items():
        spec = get_spec(kind)
        # A group holds one job per partition of a kind: its property, or its portfolio without one.
        by_property = {(item.job.property_id if spec.has_property else item.job.portfolio_id): item for item in items}
        attachment = attachment_column(kind)
        ranges = [
            {
                "property_id": item.job.property_id,
                "portfolio_id": item.job.portfolio_id,
                "after_id": item.after_id,
                "last_id": item.last_id,
                "cutoff": db_datetime(item.cutoff),
            }
            for item in items
        ]
        params = {**sql.rows_params("g", statements.delete_columns(spec), ranges), "kind": kind}
        # The DELETE takes the counted candidates: they are the ledger's.
        params["ids"] = sql.array_text([i for item in items for i in item.ids or ()])
        # And their span of timestamps, bound as literals (each item here
        # has candidates, so bounds; a NULL would only delete nothing).
        params["ts_lo"] = min(item.ts_lo for item in items)
        params["ts_hi"] = max(item.ts_hi for item in items)
        for item in items:
            item.in_range = item.candidates
        statement = statements.group_delete(spec, pruning=pruning(spec))
        for property_id, document_id, record_id, n_held in sql.execute(statement, params, cur=cur).fetchall():
            item = by_property[property_id]  # a key as the database gives it: an int, a UUID, a str
            if n_held is not None:
                item.held = int(n_held)
                continue
            job_id = item.job.id
            deleted[job_id] = deleted.get(job_id, 0) + 1
            if attachment and document_id:
                documents.setdefault(job_id, []).append((document_id, spec.key_value(record_id)))
    return deleted, documents


def attachment_column(kind: str) -> str | None:
    """The document id column of a record kind, or None when it has no attachments."""
    return get_spec(kind).attachment_column
