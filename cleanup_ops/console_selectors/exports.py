"""The CSV exports of the console's lists (issue 39, item 7): the rows the
list page shows — the same filter, scope and sort — as identifiers, counts,
statuses and timestamps only. Never a record's contents, an error message
or a reason: a column is in these lists or it is not exported.

Each export is one query read in chunks (``QuerySet.iterator``), so a list
of a million jobs streams in constant memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from cleanup_ops.console_selectors.paging import Sort, sorted_rows

EXPORT_CHUNK = 2000

# Column heading → field. Identifiers, kinds, states, counts and times.
JOB_EXPORT_COLUMNS = {
    "job_id": "id",
    "sweep_id": "sweep_id",
    "sweep": "sweep__key",
    "portfolio_id": "portfolio_id",
    "property_id": "property_id",
    "record_kind": "record_kind",
    "job_kind": "job_kind",
    "state": "state",
    "outcome": "outcome",
    "failed_attempts": "attempt",
    "last_failure_category": "last_error_category",
    "rows_deleted": "rows_deleted",
    "rows_held": "rows_held",
    "redrive_of": "redrive_of_id",
    "created_at": "created_at",
    "due_at": "available_at",
    "finished_at": "finished_at",
}
LETTER_EXPORT_COLUMNS = {
    "letter_id": "id",
    "job_id": "job_id",
    "sweep_id": "sweep_id",
    "portfolio_id": "portfolio_id",
    "property_id": "property_id",
    "record_kind": "record_kind",
    "category": "category",
    "http_status": "http_status",
    "failed_attempts": "attempts",
    "status": "status",
    "redrive_job_id": "redrive_job_id",
    "first_seen_at": "first_seen_at",
    "last_seen_at": "last_seen_at",
    "resolved_at": "resolved_at",
}


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def export_rows(listed: QuerySet[Any], *, sort: Sort, columns: dict[str, str]) -> Iterator[list[Any]]:
    """The heading, then every row of ``listed`` (filtered and scoped) in
    ``sort``'s order, as lists of cells."""
    yield list(columns)
    rows = sorted_rows(listed, sort).order_by(*sort.ordering()).values_list(*columns.values())
    for row in rows.iterator(chunk_size=EXPORT_CHUNK):
        yield [_cell(value) for value in row]
